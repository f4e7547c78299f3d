// ProcessContext: the process layer of the per-node agent (torch's PContext): spawn workers, learn at once
// when each one exits, signal them, stop them, reap them. The agent loop sits on top of it.
//
// Spawning (agent/process/spawn.h: clone(CLONE_VM | CLONE_VFORK), no shell): each worker is exec'd directly
// (argv[0] is looked up in the PATH of the worker's own environment, falling back to the agent's PATH, when
// it contains no '/'), with exactly the environment given, in a process group of its own (setpgid(0, 0) in
// the child, so a terminal's Ctrl-C reaches only the agent, which forwards it), with every signal unblocked,
// the agent's signal handlers and SIGPIPE/SIGXFSZ back at their defaults, no fd of the agent but 0-2
// (close_range(CLOEXEC), Linux >= 5.11; on older kernels only fds opened O_CLOEXEC stay out), and
// prctl(PR_SET_PDEATHSIG, SIGKILL) plus the getppid() race check, so no worker outlives a SIGKILLed agent.
// PR_SET_PDEATHSIG fires when the *thread* that forked dies, not the process: call spawn() only from a
// thread that lives as long as the workers (the io_context's thread of the agent); the end of that thread
// SIGKILLs every worker it spawned.
//
// Exit detection is event-driven, without polling: a pidfd (pidfd_open(2), Linux >= 5.3)
// per worker is waited on by the io_context; on readiness the status is read with waitid(WNOWAIT). An
// exited worker is kept as a zombie (not reaped) until stop() completes or the context is destroyed: the
// zombie pins its pid and process-group id, so killing what is left of its group later can never hit an
// unrelated process that reused the number. Requirements on the rest of the agent process: do not set
// SIGCHLD to SIG_IGN and do not call waitpid(-1, ...) or Boost.Process's on_exit (they would reap workers
// behind our back); set SIGPIPE to SIG_IGN if the agent's stdout may be a pipe that closes.
//
// Stopped workers: SIGCHLD is caught (an asio signal_set on io, SA_RESTART added: calls that the kernel
// restarts are not interrupted; poll, epoll_wait, nanosleep and the like may still fail with EINTR in any
// thread of the process). On each one, every running worker's stop or continue report is consumed with
// waitid(WSTOPPED | WCONTINUED | WNOHANG) (without WEXITED: this never reaps anything), and a worker stopped
// by a signal (SIGTTIN, SIGTTOU, SIGTSTP, SIGSTOP) is reported once per stop, as one error line
// (terminal.h's stop_message). It is not resumed: a SIGTTIN or SIGTTOU stop would only repeat, since the
// worker retries the same access to the terminal. signal_all() and stop() send SIGCONT after their signal to
// a worker that is stopped, so that it acts on it.
//
// Terminal (WorkerLaunch::stdin_mode == kTerminal, at most one worker at a time): the child makes its process
// group the terminal's foreground before exec (a released standby: the agent does it); the agent takes the
// foreground back to its own group when that worker stops (so that Ctrl-C reaches the agent again), gives
// it again when the worker continues, and takes it back for good when the worker exits and on close().
//
// Output of one stream (stdout or stderr) of a worker:
//  - console on, and a file, a prefix or whole_lines set: the child writes into a pipe that the agent reads
//    asynchronously; whole lines go to the agent's fd 1 / fd 2, each with `prefix` in front. A write()
//    never carries part of a line: consecutive whole lines are batched into one write() of at most
//    PIPE_BUF bytes (a longer line gets a write() of its own), so lines stay whole even against other
//    processes writing to the same pipe. A line longer than 64 KiB is cut every 64 KiB (each piece ends in
//    '\n' and gets the prefix); a last line without '\n' is emitted, with '\n' added, at end of stream. The
//    bytes read are also appended, unchanged and unprefixed, to the file when one is set (tee).
//  - a file and no console: the child's fd is the file itself (opened O_TRUNC, like torchrun's "w"); no copy.
//  - console on, no file, no prefix, not whole_lines: the child inherits the agent's fd (no pipe).
//  - console off, no file: the stream goes to /dev/null.
// Ordering of output and exit: when a worker exits, every byte it wrote is already in its pipe; the agent
// consumes exactly the bytes present at that moment before calling on_exit, so on_exit never overtakes the
// worker's own output (a grandchild still holding the pipe does not delay on_exit; its later output keeps
// flowing until the pipe's end of file or the context's destruction).
//
// Threads: not thread-safe. Construct, call every method and destroy on the io_context's thread (or while
// io is not running). Callbacks (on_exit, stop's done) run on io's thread from inside io.run(); they may
// call any method of the context, but must not destroy it (destroy it from a handler of your own instead).
// Blocking: spawn() blocks until the child has exec'd (or failed to); the destructor blocks until every
// worker is reaped after SIGKILL (a process in uninterruptible sleep delays it). Console writes are
// synchronous on io's thread: a console that stops reading (a paused pager) stalls io's thread and, through
// the pipes, the teed workers.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/process/worker_launch.h"

namespace ddprun::agent {

class ProcessContext {
 public:
  using ExitFn = std::function<void(int local_rank, pid_t pid, ExitStatus)>;

  // Everything runs on `io` (one thread). on_exit is called once per worker, on io's thread, as soon as the
  // worker has exited and its output up to that moment has been consumed.
  ProcessContext(boost::asio::io_context& io, ExitFn on_exit);
  // SIGKILLs every worker's process group (running workers and what is left of exited ones), reaps every
  // worker, flushes output already in the pipes, and closes them. on_exit and done are not called anymore.
  ~ProcessContext();
  ProcessContext(const ProcessContext&) = delete;
  ProcessContext& operator=(const ProcessContext&) = delete;

  // Spawns one worker (see the top of this file) and returns its pid, which is also its process-group id.
  // With a standby for w.local_rank that fits (prestart()), releases it instead, with the same streams; if
  // the release fails (the standby died), the standby is killed and the worker started fresh.
  // Throws std::system_error naming the program (or the file) when it cannot be started: program not found
  // or not executable, output file not writable, fork/exec failure. Throws std::invalid_argument for an
  // empty argv and std::logic_error while a stop() is in progress. Call from the io thread only (see above).
  pid_t spawn(const WorkerLaunch& w);

  // Starts a standby for like.local_rank (agent/process/prestart.h): `like.argv[0..interpreter_args) stub`,
  // waiting to be released by a later spawn() of that local rank with the same interpreter prefix, which then
  // runs its script in it instead of a fresh process. Replaces (SIGKILLs) an earlier standby of that local
  // rank. A standby that exits before it is needed is reaped and logged (warning); the next spawn starts
  // fresh. Standbys are not workers: running(), pids(), stop() and on_exit leave them out; the destructor
  // SIGKILLs them. Throws like spawn().
  void prestart(const WorkerLaunch& like, size_t interpreter_args, const std::filesystem::path& stub);
  // Local ranks with a standby waiting (ascending).
  std::vector<int> standbys() const;

  // kill(-pgid, sig) for each running worker (then SIGCONT to one that is stopped). Returns at once; exits
  // are reported through on_exit.
  void signal_all(int sig);

  // Sends `sig` to the process group of every running worker; SIGKILLs the groups still running after
  // `grace`; once no worker runs, SIGKILLs every worker's group (grandchildren left behind included) and
  // reaps the workers, then posts `done` to io (also when nothing runs: then at the next turn of io, never
  // inside stop()). on_exit is still called for each worker as it exits. A stop() during a stop sends its
  // signal too, keeps the earlier of the two deadlines, and adds its `done`. `done` may be empty.
  void stop(int sig, std::chrono::milliseconds grace, std::function<void()> done);

  // Workers spawned and not yet exited, and their pids (ascending).
  size_t running() const;
  std::vector<pid_t> pids() const;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
