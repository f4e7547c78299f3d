#include "agent/state/state_keeper.h"

#include <spdlog/spdlog.h>

#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

StateKeeper::StateKeeper(const AgentConfig& config) : config_(config), dir_(config.state.dir) {
  guard_.emplace(dir_.dir());
  spdlog::info("training state in {} (--state_memory {})", dir_.dir().string(),
               mib_text(config.state.memory));
}

StateKeeper::~StateKeeper() {
  dir_.remove();
}

void StateKeeper::before_spawn(const rdzv::RendezvousInfo& round) {
  const auto removed = StateDirectory::remove_temporaries(dir_.own());
  if (!removed.empty()) {
    spdlog::info("round {}: removed {} unfinished version(s) of workers killed while saving: {}", round.round,
                 removed.size(), join(removed, ", "));
  }
}

}  // namespace ddprun::agent
