// StateKeeper: the agent's side of --state_memory (docs/state.md). The workers save their training state into
// the node's memory-backed directory (agent/state/state_directory.h) with ddprun.state or the SDK's
// ddprun::sdk::state; the keeper owns that directory for the agent's whole life: it creates it (with a
// guard process that removes it should the agent die without doing so, agent/state/state_guard.h), cleans up
// after workers killed mid-save before each generation starts, and removes it when the agent ends.
//
// Threads: the agent loop's. Errors: the constructor throws std::filesystem::filesystem_error naming the
// directory it cannot create; the rest never throw but std::bad_alloc.
#pragma once

#include <cstdint>
#include <optional>

#include "agent/agent_config.h"
#include "agent/state/state_directory.h"
#include "agent/state/state_guard.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

class StateKeeper {
 public:
  // Creates config.state.dir (fresh) and its guard. `config` must outlive the keeper.
  explicit StateKeeper(const AgentConfig& config);
  // Removes the directory.
  ~StateKeeper();
  StateKeeper(const StateKeeper&) = delete;
  StateKeeper& operator=(const StateKeeper&) = delete;

  // Before a generation of workers starts in `round` (none runs): removes what workers killed mid-save left.
  void before_spawn(const rdzv::RendezvousInfo& round);

  const StateDirectory& directory() const { return dir_; }

 private:
  const AgentConfig& config_;
  StateDirectory dir_;
  std::optional<StateGuard> guard_;
};

}  // namespace ddprun::agent
