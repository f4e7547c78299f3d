#include "agent/elastic_agent.h"

#include <spdlog/spdlog.h>

#include "agent/loop/agent_loop.h"

namespace ddprun::agent {

ElasticAgent::ElasticAgent(AgentConfig config, std::unique_ptr<rdzv::RendezvousHandler> rendezvous)
    : loop_(std::make_unique<AgentLoop>(std::move(config), std::move(rendezvous))) {}

ElasticAgent::~ElasticAgent() = default;

int ElasticAgent::run() {
  try {
    return loop_->run();
  } catch (const std::exception& e) {
    // A bug: an error no step expected. Destroying the loop kills and reaps every worker; the job ends with
    // ddprun's own failure code rather than std::terminate.
    spdlog::critical("internal error: {}; stopping the workers", e.what());
    loop_.reset();
    return kExitInternal;
  }
}

}  // namespace ddprun::agent
