// How a worker's standard streams are wired before it is spawned (agent/process/process_context.h says which
// wiring each case gets): for stdout and stderr, the fd the child gets, the read end of a pipe that the agent
// pumps (agent/process/output_pump.h) and the log file the pump copies to; for stdin, /dev/null or the
// agent's own.
//
// Opens files and pipes (O_CLOEXEC), nothing else. Errors: std::system_error whose message starts with `who`
// and names the file. Thread-safe (no shared state).
#pragma once

#include <filesystem>
#include <string>

#include "agent/process/worker_launch.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

// One stream (stdout or stderr) of a child.
struct StreamSetup {
  UniqueFd child_fd;   // becomes the child's fd 1/2; -1: inherit the agent's
  UniqueFd pipe_read;  // -1: no pipe
  UniqueFd tee_file;   // -1: no file copy
};

// A pipe when the stream is shown and also goes to a file, gets a prefix or must keep its lines whole (the
// file, opened O_TRUNC, is then the pump's copy); else the file itself; else, not shown, /dev/null; else the
// agent's own fd.
StreamSetup setup_stream(const std::filesystem::path& file, bool console, const std::string& prefix,
                         bool whole_lines, const std::string& who);

// The worker's fd 0 when it is not the agent's: /dev/null for kNull; -1 otherwise.
UniqueFd open_stdin(WorkerLaunch::Stdin mode, const std::string& who);

}  // namespace ddprun::agent
