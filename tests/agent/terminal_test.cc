// Unit tests of agent/terminal's decisions: who reads the terminal, what a stopped worker's error line says.
#include "agent/process/terminal.h"

#include <csignal>
#include <string>

#include "catch_compat.h"

using namespace ddprun::agent;
using Stdin = WorkerLaunch::Stdin;

TEST_CASE("with a foreground terminal local rank 0 holds it and the other local ranks read /dev/null") {
  CHECK(worker_stdin(0, true) == Stdin::kTerminal);
  CHECK(worker_stdin(1, true) == Stdin::kNull);
  CHECK(worker_stdin(7, true) == Stdin::kNull);
}

TEST_CASE("without a foreground terminal every worker inherits the agent's stdin") {
  CHECK(worker_stdin(0, false) == Stdin::kInherit);
  CHECK(worker_stdin(3, false) == Stdin::kInherit);
}

TEST_CASE("Ctrl-C and Ctrl-\\ are the user's interrupt; other signals are not") {
  CHECK(is_terminal_interrupt(SIGINT));
  CHECK(is_terminal_interrupt(SIGQUIT));
  CHECK_FALSE(is_terminal_interrupt(SIGTERM));
  CHECK_FALSE(is_terminal_interrupt(SIGTSTP));
  CHECK_FALSE(is_terminal_interrupt(0));
}

TEST_CASE("a worker stopped by SIGTTIN: rank, pid, signal, why and what to do, on one line") {
  const std::string m = stop_message(2, 4242, SIGTTIN, Stdin::kNull);
  CHECK(
      m ==
      "local_rank 2 (pid 4242) is stopped by SIGTTIN: it read the terminal, which only local_rank 0 may use "
      "under ddprun (the other local ranks read end of file on stdin); read input in local_rank 0 only. The "
      "job waits for it: resume it with `kill -CONT 4242`, or stop the job with Ctrl-C");
  CHECK(m.find('\n') == std::string::npos);
}

TEST_CASE("a SIGTTIN or SIGTTOU stop without a foreground terminal says ddprun is in the background") {
  const std::string in = stop_message(0, 10, SIGTTIN, Stdin::kInherit);
  CHECK(in.starts_with(
      "local_rank 0 (pid 10) is stopped by SIGTTIN: it read the terminal, but ddprun is not the "
      "terminal's foreground job"));
  const std::string out = stop_message(1, 11, SIGTTOU, Stdin::kInherit);
  CHECK(out.starts_with(
      "local_rank 1 (pid 11) is stopped by SIGTTOU: it changed the terminal's settings, but"));
}

TEST_CASE("Ctrl-Z and SIGSTOP stops are named too") {
  CHECK(stop_message(0, 5, SIGTSTP, Stdin::kTerminal)
            .find("Ctrl-Z suspends only the worker that holds the "
                  "terminal") != std::string::npos);
  CHECK(stop_message(3, 6, SIGSTOP, Stdin::kNull)
            .starts_with("local_rank 3 (pid 6) is stopped by SIGSTOP: someone "
                         "stopped it"));
}
