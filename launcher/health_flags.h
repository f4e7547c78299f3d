// The health flags (--health_check, --health_check_timeout, --health_check_interval, --health_check_attempts,
// --health_check_builtin, --gpu_memory_wait; ddprun extensions, docs/cli.md) as the agent's HealthPolicy
// (agent/health/health_check.h).
//
// Throws UsageError naming the flag and what it expects. Thread-safe (no state).
#pragma once

#include <functional>
#include <string>

#include "agent/agent_config.h"
#include "launcher/flag_values.h"

namespace ddprun::launcher {

// `get` gives each flag's value (given, else its default).
agent::HealthPolicy parse_health_flags(const std::function<Given(const std::string&)>& get);

}  // namespace ddprun::launcher
