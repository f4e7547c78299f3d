// StateKeeper: the agent's side of --state_memory (docs/state.md). The workers save their training state into
// the node's memory-backed directory (agent/state/state_directory.h) with ddprun.state (Python) or
// ddprun::sdk::state (C++); the keeper owns that directory for the agent's whole life: it creates it (with a
// guard process that removes it should the agent die without doing so, agent/state/state_guard.h) and removes
// it when the agent ends. Beside it run its state server (agent/state/state_server.h: the buddy's copies in,
// a restoring node's requests answered) and its replicator (agent/state/replicator.h: this node's versions
// out to the buddy).
//
// before_spawn(), before each generation of workers starts (none runs):
//   1. removes what workers killed mid-save left;
//   2. publishes this node's round document (agent/state/state_peers.h: its server, what it holds) in the
//   job's
//      store;
//   3. restores every local rank that has no version on this node (a spare or a new node taking a lost
//      node's ranks) from the node that holds it (the lost node's buddy), waiting up to kPeersWait for the
//      round's documents: only the version of the newest step every rank of the job has somewhere (the one
//      the workers will agree on), or, when there is no such step, every version of the node holding the
//      newest; a rank no node holds is left without (its load() is None);
//   4. points the replicator at this round's buddy (the next node).
// Without a store of ddprun's (the etcd backends: observer_store() is nullopt) only step 1 runs: the state is
// kept on the node, not copied.
//
// Threads: the agent loop's; stats() from any thread. Blocking: before_spawn() waits for the store (its
// requests time out after kStoreTimeout) and for the restores (each transfer fails after 30 s without
// progress). Errors: the constructor throws std::filesystem::filesystem_error naming the directory it cannot
// create; the rest never throw but std::bad_alloc (what fails is logged; the workers start anyway).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/state/replicator.h"
#include "agent/state/state_directory.h"
#include "agent/state/state_guard.h"
#include "agent/state/state_peers.h"
#include "agent/state/state_server.h"
#include "agent/state/state_stats.h"
#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/store/store.h"

namespace ddprun::agent {

class StateKeeper {
 public:
  static constexpr std::chrono::milliseconds kPeersWait{30000};
  static constexpr std::chrono::milliseconds kStoreTimeout{10000};

  // Creates config.state.dir (fresh) and its guard. `config` must outlive the keeper.
  explicit StateKeeper(const AgentConfig& config);
  // Stops the server and the replicator, removes the directory.
  ~StateKeeper();
  StateKeeper(const StateKeeper&) = delete;
  StateKeeper& operator=(const StateKeeper&) = delete;

  // Before a generation of workers starts in `round` (see above); `store`: the job's store as this node
  // reaches it now (RendezvousHandler::observer_store()).
  void before_spawn(const rdzv::RendezvousInfo& round, const std::optional<rdzv::StoreAccess>& store);

  // What the job shows of it (`ddprun status`, the metrics).
  StateStats stats() const;
  const StateDirectory& directory() const { return dir_; }

 private:
  std::vector<int> local_ranks() const;
  NodeState node_state(const rdzv::Endpoint& me) const;
  // Restores `missing` (ranks without a version here) from the peers' documents of `round`; `mine`: this
  // node's own document of the round (what it holds).
  void restore(const std::vector<int>& missing, const NodeState& mine, const rdzv::RendezvousInfo& round,
               const rdzv::StoreAccess& access, rdzv::Store& store);
  // Gets `rank`'s versions from `holder` (only `step`'s, unless kEveryStep) into own/; the number committed
  // (throws StateTransferError).
  int fetch(int rank, const rdzv::Endpoint& holder, const rdzv::StoreAuth* auth, int64_t step);

  const AgentConfig& config_;
  StateDirectory dir_;
  std::optional<StateGuard> guard_;
  mutable std::mutex mu_;
  std::optional<rdzv::RendezvousInfo> round_;  // the current one; guarded by mu_
  std::unique_ptr<StateServer> server_;        // from the first round with a store on
  std::unique_ptr<Replicator> replicator_;
  bool warned_no_store_ = false;
};

}  // namespace ddprun::agent
