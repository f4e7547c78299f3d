// What the worker_group unit tests share (worker_group_test.cc, worker_group_restart_test.cc): a group of
// node 1 of 2 with two workers, and helpers to read the actions supervise() returns. Header-only;
// tests/agent/ only.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "agent/worker_group.h"
#include "catch_compat.h"

namespace worker_group_testing {

using namespace ddprun::agent;
using ddprun::rdzv::RendezvousInfo;
using ddprun::rdzv::RoundStop;
using AK = Action::Kind;
using EK = GroupEvent::Kind;

// Node 1 of 2 in round 3, two local workers (ranks 2 and 3), restarts left.
struct Fixture {
  WorkerGroup g;
  SupervisionPolicy p{.max_restarts = 2};
  JobState job{.host = "node-b"};

  Fixture() {
    g.round.round = 3;
    g.round.group_rank = 1;
    g.round.group_world_size = 2;
    g.round.base_rank = 2;
    g.round.world_size = 4;
    for (int lr = 0; lr < 2; ++lr)
      g.workers.push_back(Worker{.local_rank = lr, .rank = 2 + lr, .pid = 100 + lr});
  }

  std::vector<Action> on(GroupEvent e) { return supervise(g, job, e, p); }
  std::vector<Action> exited(int local_rank, ExitStatus status, std::string error_file = "") {
    GroupEvent e{.kind = EK::kWorkerExited, .local_rank = local_rank, .status = status};
    if (!status.success()) {
      e.failure = WorkerFailure{.host = job.host,
                                .rank = 2 + local_rank,
                                .local_rank = local_rank,
                                .exit_code = status.exit_code,
                                .signal = status.signal,
                                .error_file = std::move(error_file)};
    }
    return on(e);
  }
  std::vector<Action> stopped() { return on(GroupEvent{.kind = EK::kGroupStopped}); }
};

inline std::vector<AK> kinds(const std::vector<Action>& actions, bool with_logs = false) {
  std::vector<AK> out;
  for (const auto& a : actions) {
    if (with_logs || a.kind != AK::kLog) out.push_back(a.kind);
  }
  return out;
}

inline const Action& find(const std::vector<Action>& actions, AK kind) {
  for (const auto& a : actions) {
    if (a.kind == kind) return a;
  }
  FAIL("no action of the kind asked for");
  return actions.front();
}

inline std::string logs(const std::vector<Action>& actions) {
  std::string out;
  for (const auto& a : actions) {
    if (a.kind == AK::kLog) out += a.text + "\n";
  }
  return out;
}

inline RoundStop peer_stop(RoundStop::Kind kind, int exit_code = 1,
                           std::string detail = "rank 0 on node-a: exit code 1") {
  return RoundStop{kind, 0, std::move(detail), exit_code};
}

}  // namespace worker_group_testing
