// Unit tests of agent/worker_group's restart accounting across attempts: a restart given back when the next
// round lacks a node of this one (give_back_restart), and --max_no_progress_restarts. No process, file or
// socket.
#include <csignal>
#include <tuple>
#include <utility>

#include "agent/worker_group.h"
#include "catch_compat.h"
#include "worker_group_fixture.h"

using namespace ddprun::agent;
using namespace worker_group_testing;

namespace {

// One failed attempt: local rank 1 fails after `steps` steps, the probe finds every node alive; the stop that
// was published (not yet reported back), and after the group stopped, the round's end.
std::pair<RoundStop, Action> fail_attempt(Fixture& f, uint64_t steps) {
  f.g = Fixture().g;
  GroupEvent failed{.kind = EK::kWorkerExited, .local_rank = 1, .status = ExitStatus{.exit_code = 3}};
  failed.failure = WorkerFailure{.host = f.job.host, .rank = 3, .local_rank = 1, .exit_code = 3};
  failed.steps = steps;
  f.on(failed);
  auto published = f.on(GroupEvent{.kind = EK::kLivenessProbed});
  const RoundStop stop = find(published, AK::kPublishStop).stop;
  f.on(GroupEvent{.kind = EK::kStopPublished, .stop = stop});
  f.exited(0, ExitStatus{.signal = SIGTERM});
  GroupEvent stopped{.kind = EK::kGroupStopped};
  stopped.steps = steps;
  return {stop, f.on(stopped).back()};
}

}  // namespace

TEST_CASE(
    "no progress (--max_no_progress_restarts): attempts that do not pass the previous one's step stop the "
    "job with 7") {
  Fixture f;
  f.p.max_restarts = 10;
  f.p.max_no_progress_restarts = 2;
  auto [stop, end] = fail_attempt(f, 16);  // progress: step 16 passed 0
  CHECK(stop.kind == RoundStop::Kind::kFailed);
  CHECK(end.outcome == Outcome::kRestart);
  CHECK(f.job.attempts_without_progress == 0);
  std::tie(stop, end) = fail_attempt(f, 16);  // resumed from a checkpoint, crashed at the same step
  CHECK(stop.kind == RoundStop::Kind::kFailed);
  CHECK(f.job.attempts_without_progress == 1);
  SECTION("a third attempt at the same step: the job stops everywhere with kExitNoProgress") {
    std::tie(stop, end) = fail_attempt(f, 16);
    CHECK(stop.kind == RoundStop::Kind::kShutdown);
    CHECK(stop.exit_code == kExitNoProgress);
    CHECK(stop.detail ==
          "2 failed attempt(s) in a row made no progress (step 16, previous attempt 16; "
          "--max_no_progress_restarts 2)");
    CHECK(end.outcome == Outcome::kExit);
    CHECK(end.exit_code == kExitNoProgress);
    CHECK(f.job.restarts_done == 2);  // restarts were left
  }
  SECTION("an attempt that gets further resets the count") {
    std::tie(stop, end) = fail_attempt(f, 25);
    CHECK(stop.kind == RoundStop::Kind::kFailed);
    CHECK(f.job.attempts_without_progress == 0);
    CHECK(end.outcome == Outcome::kRestart);
  }
}

TEST_CASE("without --max_no_progress_restarts a loop restarts until --max_restarts") {
  Fixture f;
  for (int i = 0; i < 2; ++i) CHECK(fail_attempt(f, 16).second.outcome == Outcome::kRestart);
  auto [stop, end] = fail_attempt(f, 16);
  CHECK(stop.kind == RoundStop::Kind::kFailed);
  CHECK(end.outcome == Outcome::kExit);
  CHECK(end.exit_code == 3);
}

TEST_CASE("a round after a membership change gives nothing back") {
  JobState job{.restarts_done = 1};
  SupervisionPolicy p{.max_restarts = 3};
  CHECK(give_back_restart(job, RendezvousInfo{.round = 4, .dropped_nodes = {"h2:1"}}, p).empty());
  CHECK(job.restarts_done == 1);
}
