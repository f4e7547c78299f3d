// What the job shows of its training state (--state_memory; docs/state.md): per local rank, the newest
// version its node holds and the newest its buddy committed a copy of, and the bytes the node's directory
// holds. Made by StateKeeper::stats() (agent/state/state_keeper.h); shown in the status document (`ddprun
// status`, agent/observe/status_document.h) and the metrics (agent/observe/agent_metrics.h).
//
// Plain data.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace ddprun::agent {

struct StateStats {
  struct Rank {
    int rank = 0;
    std::optional<int64_t> step;          // its newest committed version on this node
    std::optional<int64_t> replica_step;  // the newest one its buddy committed a copy of
  };
  std::vector<Rank> ranks;  // this node's ranks in the current round
  uint64_t bytes_held = 0;  // every file of the directory: own versions and the copies of the previous node's
};

}  // namespace ddprun::agent
