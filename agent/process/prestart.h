// Pre-started Python workers (`--prestart`): the next generation of a local rank's worker is started ahead
// of need — interpreter up, `import torch` done — and waits; a restart releases it with that attempt's
// command line, environment and output streams instead of starting a fresh interpreter.
//
// A standby is `<interpreter argv prefix> <stub>` (the prefix is the worker's own argv up to its script:
// `python -u`), spawned like a worker (agent/process/spawn.h: own process group, PR_SET_PDEATHSIG, the
// launch's CPU affinity) with the environment of the launch it was modelled on, fd 3 one end of a
// SOCK_SEQPACKET socket pair, stdout/stderr the agent's, stdin the agent's or /dev/null as the launch says (a
// terminal holder's foreground is given by the agent at release). The stub (agent/process/prestart_stub.py,
// written to the run directory) imports torch, then blocks reading the socket. release() sends one message —
// JSON {"argv": [script args...], "env": {...}, "stdout": bool, "stderr": bool} — with the new stdout/stderr
// fds (SCM_RIGHTS) where they are replaced; the stub puts them on fd 1/2, replaces os.environ and runs the
// script with runpy. Closing the socket without a message makes an unused standby exit 0.
//
// Threads: not thread-safe; the owner (ProcessContext) calls everything from one thread.
// Errors: start_standby throws std::system_error like spawn_process; release throws std::system_error when
// the standby is gone (EPIPE, ECONNRESET) or the message cannot be sent.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "agent/process/worker_launch.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

// The stub's Python source (agent/process/prestart_stub.py).
const std::string& prestart_stub_source();

struct Standby {
  int local_rank = 0;
  pid_t pid = -1;
  UniqueFd pidfd;
  UniqueFd channel;                      // the agent's end of the socket pair
  std::vector<std::string> interpreter;  // the argv prefix it runs (e.g. {"/usr/bin/python3", "-u"})
};

// Starts a standby for like.local_rank running `like.argv[0..interpreter_args) stub`, in the cgroup of
// cgroup_fd / cgroup_procs_fd (-1: the agent's; see agent/process/spawn.h and agent/process/orphan_guard.h).
// Preconditions: 0 < interpreter_args < like.argv.size().
Standby start_standby(const WorkerLaunch& like, size_t interpreter_args, const std::filesystem::path& stub,
                      int cgroup_fd, int cgroup_procs_fd);

// True when `w` can be run by `standby`: the same local rank and interpreter prefix.
bool standby_fits(const Standby& standby, const WorkerLaunch& w);

// Sends `w` to the standby: argv after the interpreter prefix, w.env, and out_fd/err_fd (-1: keep the
// agent's stream the standby inherited). The fds are duplicated into the message; the caller keeps its own.
void release(Standby& standby, const WorkerLaunch& w, int out_fd, int err_fd);

}  // namespace ddprun::agent
