// Unit tests of agent/worker_group: the agent's supervision of its worker group as a transition function,
// event by event. No process, file or socket: events go in, actions come out.
#include "agent/worker_group.h"

#include <csignal>
#include <string>
#include <vector>

#include "agent/worker_launches.h"  // make_worker_group
#include "catch_compat.h"
#include "worker_group_fixture.h"

using namespace ddprun::agent;
using namespace worker_group_testing;

TEST_CASE("every local worker succeeding marks the node done and waits in the exit barrier") {
  Fixture f;
  CHECK(kinds(f.exited(0, {})).empty());
  CHECK(f.g.state == GroupState::kHealthy);
  CHECK(f.g.workers[0].state == WorkerState::kSucceeded);
  auto a = f.exited(1, {});
  CHECK(kinds(a) == std::vector{AK::kMarkNodeDone});
  CHECK(logs(a) == "all 2 local workers succeeded\n");
  CHECK(f.g.state == GroupState::kSucceeded);
  CHECK(f.g.in_exit_barrier);
  // The last node's node_done stops the round as done: stop the (empty) group, then finish with success.
  a = f.on(GroupEvent{.kind = EK::kRoundStopped, .stop = RoundStop{RoundStop::Kind::kDone, 0, "", 0}});
  CHECK(kinds(a) == std::vector{AK::kStopWorkers});
  CHECK_FALSE(f.g.in_exit_barrier);
  a = f.stopped();
  REQUIRE(kinds(a) == std::vector{AK::kFinish});
  CHECK(a[0].outcome == Outcome::kSucceeded);
  CHECK(a[0].exit_code == 0);
  CHECK(a[0].close_rendezvous);
  CHECK(f.g.state == GroupState::kStopped);
}

TEST_CASE("a failed worker: the group is stopped first, liveness probed after, then the failure published") {
  Fixture f;
  auto a = f.exited(1, ExitStatus{.exit_code = 7});
  REQUIRE(kinds(a) == std::vector{AK::kStopWorkers, AK::kProbeLiveness});
  CHECK(a[1].signal == SIGTERM);  // a[0] is the log line
  CHECK(find(a, AK::kStopWorkers).grace == f.p.shutdown_grace);
  CHECK(logs(a) == "worker local_rank 1 (rank 3, pid 101) failed: exit code 7\n");
  CHECK(f.g.state == GroupState::kStopping);
  CHECK(f.g.workers[1].state == WorkerState::kFailed);

  a = f.on(GroupEvent{.kind = EK::kLivenessProbed});
  REQUIRE(kinds(a) == std::vector{AK::kPublishStop});
  CHECK(a[0].stop.kind == RoundStop::Kind::kFailed);
  CHECK(a[0].stop.node_rank == 1);
  CHECK(a[0].stop.detail == "rank 3 on node-b: exit code 7");
  CHECK(a[0].stop.exit_code == 7);
  f.on(GroupEvent{.kind = EK::kStopPublished, .stop = a[0].stop});

  // The other worker ends by the agent's SIGTERM: stopped, not a failure of its own.
  CHECK(kinds(f.exited(0, ExitStatus{.signal = SIGTERM})).empty());
  CHECK(f.g.workers[0].state == WorkerState::kStopped);
  CHECK(f.g.failures.size() == 1);

  a = f.stopped();
  REQUIRE(kinds(a) == std::vector{AK::kPrintSummary, AK::kNoteLocalFailure, AK::kFinish});
  CHECK(a.back().outcome == Outcome::kRestart);
  CHECK(a.back().exit_code == 7);
  // The restart is counted where it is decided.
  CHECK(f.job.restarts_done == 1);
  CHECK(logs(a) == "restarting the worker group (1 of 2 restarts)\n");

  SECTION("the next round lacks a node of this one: the restart was the echo of its loss and is given back") {
    RendezvousInfo next{.round = 1, .dropped_nodes = {"h3:77"}};
    CHECK(give_back_restart(f.job, next, f.p) ==
          "round 1: node(s) h3:77 of the previous round did not come back; the restart is charged to their "
          "loss, not counted (0 of 2 restarts used)");
    CHECK(f.job.restarts_done == 0);
    CHECK(give_back_restart(f.job, next, f.p).empty());  // once per restart
  }
  SECTION("every node is back: the restart stays counted") {
    CHECK(give_back_restart(f.job, RendezvousInfo{.round = 1}, f.p).empty());
    CHECK(f.job.restarts_done == 1);
  }
}

TEST_CASE("a failure that is the echo of a dead node re-forms without counting a restart") {
  Fixture f;
  f.exited(0, ExitStatus{.signal = SIGABRT});
  auto a = f.on(GroupEvent{.kind = EK::kLivenessProbed, .dead_nodes = {0}});
  REQUIRE(kinds(a) == std::vector{AK::kPublishStop});
  CHECK(a[0].stop.kind == RoundStop::Kind::kMembership);
  CHECK(a[0].stop.detail == "node(s) 0 lost");
  CHECK(f.g.failures.empty());
  f.on(GroupEvent{.kind = EK::kStopPublished, .stop = a[0].stop});
  f.exited(1, ExitStatus{.signal = SIGTERM});
  a = f.stopped();
  REQUIRE(kinds(a) == std::vector{AK::kFinish});
  CHECK(a.back().outcome == Outcome::kRejoin);
  CHECK(logs(a) == "membership changed (node(s) 0 lost): joining the next round\n");
  CHECK(f.job.restarts_done == 0);
}

TEST_CASE("a peer's stop wins over this node's later failure and stops the group with SIGTERM") {
  Fixture f;
  auto a = f.on(GroupEvent{.kind = EK::kRoundStopped, .stop = peer_stop(RoundStop::Kind::kFailed, 3)});
  REQUIRE(kinds(a) == std::vector{AK::kStopWorkers});
  CHECK(find(a, AK::kStopWorkers).signal == SIGTERM);
  CHECK(logs(a) == "round 3 ended by node 0: rank 0 on node-a: exit code 1\n");
  // Workers dying of the stop are not failures; a stale publish result changes nothing.
  f.exited(0, ExitStatus{.signal = SIGTERM});
  f.exited(1, ExitStatus{.exit_code = 1});  // no error file: the SIGTERM's echo
  CHECK(f.g.failures.empty());
  a = f.stopped();
  REQUIRE(kinds(a) == std::vector{AK::kFinish});
  CHECK(a.back().outcome == Outcome::kRestart);
  CHECK(a.back().exit_code == 3);  // the peer's root cause
}

TEST_CASE("a stopping group's worker that failed by itself (error file) joins the failures") {
  Fixture f;
  f.exited(0, ExitStatus{.exit_code = 2});
  f.exited(1, ExitStatus{.exit_code = 1}, "/logs/1/error.json");
  CHECK(f.g.failures.size() == 2);
  CHECK(f.g.failures[1].error_file == "/logs/1/error.json");
}

TEST_CASE("with no restarts left a failure ends the job with the first failure's code") {
  Fixture f;
  f.job.restarts_done = 2;
  f.exited(0, ExitStatus{.signal = SIGSEGV});
  auto a = f.on(GroupEvent{.kind = EK::kLivenessProbed});
  f.on(GroupEvent{.kind = EK::kStopPublished, .stop = a[0].stop});
  a = f.stopped();
  REQUIRE(kinds(a).back() == AK::kFinish);
  CHECK(a.back().outcome == Outcome::kExit);
  CHECK(a.back().exit_code == 128 + SIGSEGV);
}

TEST_CASE("a signal is forwarded to the workers and published; the job ends with 128+N, rendezvous open") {
  Fixture f;
  auto a = f.on(GroupEvent{.kind = EK::kSignal, .signal = SIGUSR1});
  REQUIRE(kinds(a) == std::vector{AK::kStopWorkers, AK::kPublishStop});
  CHECK(find(a, AK::kStopWorkers).signal == SIGUSR1);
  CHECK(find(a, AK::kPublishStop).stop.kind == RoundStop::Kind::kShutdown);
  CHECK(find(a, AK::kPublishStop).stop.exit_code == 128 + SIGUSR1);
  CHECK(logs(a) == "received SIGUSR1: forwarding it to the workers (grace 30 s)\n");
  a = f.stopped();
  REQUIRE(kinds(a) == std::vector{AK::kFinish});
  CHECK(a[0].exit_code == 128 + SIGUSR1);
  CHECK_FALSE(a[0].close_rendezvous);
}

TEST_CASE("the terminal holder's Ctrl-C interrupts the job as a SIGINT to the agent: no restart, 130") {
  Fixture f;
  f.g.workers[0].launch.stdin_mode = WorkerLaunch::Stdin::kTerminal;
  auto a = f.exited(0, ExitStatus{.signal = SIGINT});
  REQUIRE(kinds(a) == std::vector{AK::kStopWorkers, AK::kPublishStop});
  CHECK(find(a, AK::kStopWorkers).signal == SIGINT);
  CHECK(find(a, AK::kPublishStop).stop.kind == RoundStop::Kind::kShutdown);
  CHECK(find(a, AK::kPublishStop).stop.exit_code == 130);
  CHECK(logs(a) ==
        "local_rank 0 (pid 100), which holds the terminal, ended by SIGINT: interrupting the job, "
        "forwarding it to the workers (grace 30 s)\n");
  CHECK(f.g.failures.empty());
  f.exited(1, ExitStatus{.signal = SIGINT});
  a = f.stopped();
  REQUIRE(kinds(a) == std::vector{AK::kFinish});
  CHECK(a[0].outcome == Outcome::kExit);
  CHECK(a[0].exit_code == 130);
  CHECK_FALSE(a[0].close_rendezvous);
}

TEST_CASE("Ctrl-\\ (SIGQUIT) of the terminal holder too; a SIGINT of another worker is a failure") {
  Fixture f;
  f.g.workers[0].launch.stdin_mode = WorkerLaunch::Stdin::kTerminal;
  CHECK(find(f.exited(0, ExitStatus{.signal = SIGQUIT}), AK::kStopWorkers).signal == SIGQUIT);
  CHECK(f.stopped().back().exit_code == 128 + SIGQUIT);

  Fixture g;
  g.g.workers[1].launch.stdin_mode = WorkerLaunch::Stdin::kNull;
  auto a = g.exited(1, ExitStatus{.signal = SIGINT});
  CHECK(kinds(a) == std::vector{AK::kStopWorkers, AK::kProbeLiveness});
  CHECK(find(a, AK::kStopWorkers).signal == SIGTERM);
  CHECK(g.g.failures.size() == 1);
}

TEST_CASE("a second signal kills the workers at once") {
  Fixture f;
  f.on(GroupEvent{.kind = EK::kSignal, .signal = SIGTERM});
  auto a = f.on(GroupEvent{.kind = EK::kSignal, .signal = SIGINT});
  CHECK(kinds(a) == std::vector{AK::kKillWorkers});
  CHECK(logs(a) == "received SIGINT after SIGTERM: killing the workers now\n");
  a = f.stopped();
  CHECK(a.back().exit_code == 128 + SIGTERM);  // the first signal decides
}

TEST_CASE("the same signal twice: 'again'") {
  Fixture f;
  f.on(GroupEvent{.kind = EK::kSignal, .signal = SIGINT});
  auto a = f.on(GroupEvent{.kind = EK::kSignal, .signal = SIGINT});
  CHECK(kinds(a) == std::vector{AK::kKillWorkers});
  CHECK(logs(a) == "received SIGINT again: killing the workers now\n");
}

TEST_CASE("a signal while the group stops for a failure kills the workers, and the signal decides the code") {
  Fixture f;
  f.exited(0, ExitStatus{.exit_code = 1});
  auto a = f.on(GroupEvent{.kind = EK::kSignal, .signal = SIGINT});
  CHECK(kinds(a) == std::vector{AK::kKillWorkers});
  CHECK(logs(a) == "received SIGINT while the workers were being stopped: killing the workers now\n");
  a = f.stopped();
  CHECK(a.back().outcome == Outcome::kExit);
  CHECK(a.back().exit_code == 128 + SIGINT);
}

TEST_CASE("the same signal arriving after a peer forwarded it is not a second signal") {
  Fixture f;
  f.p.signal_exit_codes[SIGUSR1] = 75;
  f.on(GroupEvent{.kind = EK::kRoundStopped,
                  .stop = RoundStop{RoundStop::Kind::kShutdown, 0, "node 0 got SIGUSR1", 128 + SIGUSR1}});
  auto a = f.on(GroupEvent{.kind = EK::kSignal, .signal = SIGUSR1});
  CHECK(kinds(a).empty());
  CHECK(logs(a) == "received SIGUSR1 (already forwarded: node 0 got it first)\n");
  a = f.stopped();
  CHECK(a.back().exit_code == 75);
}

TEST_CASE("a peer's shutdown by signal stops these workers with that signal and maps its exit code") {
  Fixture f;
  f.p.signal_exit_codes[SIGUSR2] = 75;
  auto a =
      f.on(GroupEvent{.kind = EK::kRoundStopped,
                      .stop = RoundStop{RoundStop::Kind::kShutdown, 0, "node 0 got SIGUSR2", 128 + SIGUSR2}});
  CHECK(find(a, AK::kStopWorkers).signal == SIGUSR2);
  a = f.stopped();
  CHECK(a.back().outcome == Outcome::kExit);
  CHECK(a.back().exit_code == 75);
  CHECK_FALSE(a.back().close_rendezvous);
}

TEST_CASE("the exit barrier times out: success") {
  Fixture f;
  f.p.exit_barrier_timeout = std::chrono::milliseconds(1500);
  CHECK(kinds(f.on(GroupEvent{.kind = EK::kBarrierTimeout})).empty());  // not in the barrier: ignored
  f.exited(0, {});
  f.exited(1, {});
  auto a = f.on(GroupEvent{.kind = EK::kBarrierTimeout});
  CHECK(kinds(a) == std::vector{AK::kStopWorkers});
  CHECK(logs(a) == "exit barrier: the other nodes did not finish within 1.5 s; exiting with success\n");
  CHECK(f.stopped().back().outcome == Outcome::kSucceeded);
}

TEST_CASE("the store lost while workers run: stop them, exit 3") {
  Fixture f;
  auto a = f.on(GroupEvent{.kind = EK::kStoreLost, .error = "WAIT: lost the connection"});
  CHECK(kinds(a) == std::vector{AK::kStopWorkers});
  CHECK(logs(a) == "lost the rendezvous store: WAIT: lost the connection\n");
  // A worker failing of it afterwards is reported, but the code is the store's.
  f.exited(0, ExitStatus{.exit_code = 1});
  a = f.stopped();
  CHECK(a.back().outcome == Outcome::kExit);
  CHECK(a.back().exit_code == kExitStoreFailed);
}

TEST_CASE("the store lost in the exit barrier, or node_done failing, is still a success") {
  Fixture f;
  f.exited(0, {});
  f.exited(1, {});
  auto a = f.on(GroupEvent{.kind = EK::kStoreLost, .error = "End of file"});
  CHECK(kinds(a) == std::vector{AK::kStopWorkers});
  CHECK(f.stopped().back().outcome == Outcome::kSucceeded);

  Fixture g;
  g.exited(0, {});
  g.exited(1, {});
  a = g.on(GroupEvent{.kind = EK::kNodeDoneFailed, .error = "store gone"});
  CHECK(kinds(a) == std::vector{AK::kStopWorkers});  // nothing runs: the stop completes at once
  CHECK(g.stopped().back().outcome == Outcome::kSucceeded);
}

TEST_CASE("a failure that cannot be published means the store is lost: exit 3") {
  Fixture f;
  f.exited(0, ExitStatus{.exit_code = 1});
  auto a = f.on(GroupEvent{.kind = EK::kLivenessProbed});
  a = f.on(GroupEvent{.kind = EK::kPublishFailed, .stop = a[0].stop, .error = "SET: lost the connection"});
  CHECK(logs(a) == "cannot publish the end of round 3 to the store: SET: lost the connection\n");
  a = f.stopped();
  CHECK(kinds(a) == std::vector{AK::kPrintSummary, AK::kFinish});
  CHECK(a.back().exit_code == kExitStoreFailed);
}

TEST_CASE("a worker that cannot be started: kill the others, tell the peers, exit 5") {
  Fixture f;
  auto a = f.on(GroupEvent{.kind = EK::kSpawnFailed, .error = "python4: not found"});
  REQUIRE(kinds(a) == std::vector{AK::kStopWorkers, AK::kPublishStop});
  CHECK(find(a, AK::kStopWorkers).signal == SIGKILL);
  CHECK(find(a, AK::kStopWorkers).grace.count() == 0);
  CHECK(find(a, AK::kPublishStop).stop.exit_code == kExitSpawnFailed);
  // The store being gone changes nothing: the spawn failure is the reason.
  CHECK(logs(f.on(GroupEvent{.kind = EK::kPublishFailed, .error = "x"})).empty());
  a = f.stopped();
  CHECK(a.back().exit_code == kExitSpawnFailed);
  CHECK_FALSE(a.back().close_rendezvous);
}

TEST_CASE("a finished group ignores what comes late") {
  Fixture f;
  f.on(GroupEvent{.kind = EK::kRoundStopped,
                  .stop = peer_stop(RoundStop::Kind::kMembership, 0, "node 2 joined")});
  CHECK(f.stopped().back().outcome == Outcome::kRejoin);
  CHECK(f.on(GroupEvent{.kind = EK::kSignal, .signal = SIGTERM}).empty());
  CHECK(f.on(GroupEvent{.kind = EK::kGroupStopped}).empty());
}

TEST_CASE("make_worker_group resolves each local rank's launch for the round") {
  AgentConfig c;
  c.workers = {{.argv = {"a"}}, {.argv = {"b"}}};
  RendezvousInfo info;
  info.round = 1;
  info.base_rank = 4;
  info.world_size = 6;
  LogLayout layout("/run");
  std::vector<WorkerLogPaths> paths{layout.worker(1, 0), layout.worker(1, 1)};
  WorkerGroup g = make_worker_group(c, info, paths, "job");
  REQUIRE(g.workers.size() == 2);
  CHECK(g.workers[1].rank == 5);
  CHECK(g.workers[1].launch.argv == std::vector<std::string>{"b"});
  CHECK(g.workers[1].launch.env.at("RANK") == "5");
  CHECK(g.workers[1].paths.error_file == "/run/attempt_1/1/error.json");
  CHECK(g.state == GroupState::kHealthy);
}

namespace {

Stack waiting() {
  return {
      {"backward", "/torch/_tensor.py", 488}, {"main", "/x/train.py", 15}, {"<module>", "/x/train.py", 19}};
}
Stack sleeping() {
  return {{"stuck_in_data_loading", "/x/train.py", 5},
          {"main", "/x/train.py", 13},
          {"<module>", "/x/train.py", 19}};
}

}  // namespace

TEST_CASE(
    "a hang: capture the stacks, then fail the group naming the odd rank out (exit 6 when no restart)") {
  Fixture f;
  f.p.hang_timeout = std::chrono::seconds(15);
  f.job.restarts_done = 2;
  auto a = f.on(GroupEvent{.kind = EK::kHung});
  CHECK(kinds(a) == std::vector{AK::kCaptureStacks});
  CHECK(logs(a) ==
        "no rank made progress for 15 s (--hang_timeout): capturing every rank's stack, then stopping "
        "the group\n");
  CHECK(f.on(GroupEvent{.kind = EK::kHung}).empty());  // once
  a = f.on(
      GroupEvent{.kind = EK::kStacksCaptured, .stacks = {{2, waiting()}, {3, sleeping()}}, .time = 1000});
  CHECK(kinds(a) == std::vector{AK::kStopWorkers, AK::kProbeLiveness});
  CHECK(logs(a).find("where the ranks are: rank 2: <module> (train.py:19)") == 0);
  REQUIRE(f.g.failures.size() == 1);
  const WorkerFailure& hung = f.g.failures[0];
  CHECK(hung.exit_code == kExitHung);
  CHECK(hung.time == 1000);
  CHECK(hung.message == "no progress from any rank for 15 s (--hang_timeout)");
  CHECK(hung.stacks ==
        "rank 2: <module> (train.py:19) → main (train.py:15) → backward (_tensor.py:488)\n"
        "rank 3: <module> (train.py:19) → main (train.py:13) → stuck_in_data_loading (train.py:5)\n");
  a = f.on(GroupEvent{.kind = EK::kLivenessProbed});
  CHECK(a[0].stop.detail == "rank 2 on node-b: no progress from any rank for 15 s (--hang_timeout)");
  CHECK(a[0].stop.exit_code == kExitHung);
  f.on(GroupEvent{.kind = EK::kStopPublished, .stop = a[0].stop});
  a = f.stopped();
  CHECK(a.back().outcome == Outcome::kExit);
  CHECK(a.back().exit_code == kExitHung);
}

TEST_CASE("a hang names the rank whose stack differs from the others'") {
  Fixture f;
  f.g.workers.push_back(Worker{.local_rank = 2, .rank = 4, .pid = 102});
  f.on(GroupEvent{.kind = EK::kHung});
  f.on(GroupEvent{.kind = EK::kStacksCaptured, .stacks = {{2, waiting()}, {3, waiting()}, {4, sleeping()}}});
  REQUIRE(f.g.failures.size() == 1);
  CHECK(f.g.failures[0].rank == 4);
  CHECK(f.g.failures[0].local_rank == 2);
  CHECK(f.g.failures[0].pid == 102);
}

TEST_CASE("a hang reported while the group already stops changes nothing") {
  Fixture f;
  f.exited(0, ExitStatus{.exit_code = 1});
  CHECK(f.on(GroupEvent{.kind = EK::kHung}).empty());
}

TEST_CASE(
    "a missed FileTimer deadline: stacks first, then the timer's signal to that pid, then a named failure") {
  Fixture f;
  auto a = f.on(GroupEvent{
      .kind = EK::kDeadlineMissed, .local_rank = 1, .signal = SIGKILL, .pid = 101, .scope = "load"});
  REQUIRE(kinds(a) == std::vector{AK::kCaptureStacks, AK::kSignalProcess});
  CHECK(a.back().pid == 101);
  CHECK(a.back().signal == SIGKILL);
  CHECK(logs(a) ==
        "rank 3 missed its deadline (scope load): capturing every rank's stack, then sending SIGKILL to "
        "pid 101\n");
  f.on(GroupEvent{.kind = EK::kStacksCaptured, .stacks = {{2, waiting()}, {3, sleeping()}}});
  CHECK(f.g.failures.empty());  // not a hang: the worker's own exit is the failure
  f.exited(1, ExitStatus{.signal = SIGKILL});
  REQUIRE(f.g.failures.size() == 1);
  CHECK(f.g.failures[0].message == "rank 3 missed its deadline (scope load)");
  CHECK(f.g.failures[0].stacks.find("rank 3: <module>") != std::string::npos);
}

TEST_CASE("a deadline without a signal, or of a process that is not a worker") {
  Fixture f;
  auto a =
      f.on(GroupEvent{.kind = EK::kDeadlineMissed, .local_rank = 0, .signal = 0, .pid = 100, .scope = "s"});
  CHECK(kinds(a).empty());
  CHECK(logs(a) == "rank 2 missed its deadline (scope s) and asked for no signal: nothing done\n");
  a = f.on(
      GroupEvent{.kind = EK::kDeadlineMissed, .local_rank = -1, .signal = SIGTERM, .pid = 555, .scope = "s"});
  CHECK(kinds(a) == std::vector{AK::kSignalProcess});
  CHECK(logs(a) == "pid 555 (not a worker) missed its deadline (scope s): sending it SIGTERM\n");
}
