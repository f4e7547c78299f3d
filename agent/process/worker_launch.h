// WorkerLaunch and ExitStatus: what one worker process is started with, and how it ended. The vocabulary of
// the agent's process layer (agent/process/): ProcessContext spawns a WorkerLaunch and reports an ExitStatus;
// the agent's rounds (agent/worker_launches.h) and the launcher's --dry-run compute launches.
//
// Also the two look-ups a launch needs in the agent's own process: find_program (execvp's PATH search) and
// signal_name.
//
// Pure data; the functions are thread-safe. find_program reads the file system.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "agent/process/output_pump.h"  // DuplicateFilter

namespace ddprun::agent {

// "SIGTERM"; the number as text when the signal has no name (real-time signals).
std::string signal_name(int sig);

// execvp's lookup, done in the agent so that a missing program is an exception, not a dead child: `name`
// itself when it contains a '/', else the first executable file `name` in env's PATH (the agent's PATH when
// env has none). Throws std::system_error whose message starts with `who` and names the program.
std::string find_program(const std::string& name, const std::map<std::string, std::string>& env,
                         const std::string& who);

struct ExitStatus {
  int exit_code = 0;  // set when the worker exited normally
  int signal = 0;     // set (and exit_code 0) when a signal killed it

  bool success() const { return exit_code == 0 && signal == 0; }
  // What a shell would report: exit_code, or 128 + signal.
  int shell_code() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exit code 3" / "signal SIGSEGV (11)".
  std::string describe() const;
  bool operator==(const ExitStatus&) const = default;
};

struct WorkerLaunch {
  int local_rank = 0;
  std::vector<std::string> argv;                      // argv[0]: path, or a name looked up in PATH; no shell
  std::map<std::string, std::string> env;             // the COMPLETE environment of the child
  std::filesystem::path stdout_file, stderr_file;     // empty = not written to a file
  bool console_stdout = true, console_stderr = true;  // show on the agent's fd 1 / fd 2 (tee with a file)
  // Before every console line of the stream, e.g. "[default0]:"; "" = none.
  std::string stdout_prefix, stderr_prefix;
  // Pass console output through the agent even without a prefix or a file, so that the lines of several
  // workers sharing the console never interleave.
  bool whole_lines = false;
  // CPUs the worker is bound to (sched_setaffinity in the child, before exec); empty = the agent's own set.
  std::vector<int> cpu_affinity;
  // The worker's fd 0 (agent/process/terminal.h decides which): the agent's own; /dev/null; or the agent's
  // terminal, with the worker's process group made the terminal's foreground while the worker runs.
  enum class Stdin { kInherit, kNull, kTerminal };
  Stdin stdin_mode = Stdin::kInherit;
  // --duplicate-stdout-filters / --duplicate-stderr-filters (agent/process/output_pump.h): console lines that
  // match are also appended to the attempt's shared filtered_*.log. An active filter makes the stream go
  // through the agent (a pipe) even without a file or prefix.
  DuplicateFilter stdout_duplicate, stderr_duplicate;
};

}  // namespace ddprun::agent
