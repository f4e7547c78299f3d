// The flags for running a job on a fleet (ddprun extensions, docs/cli.md): the health checks (--health_check,
// --health_check_timeout, --health_check_interval, --health_check_attempts, --health_check_builtin; the
// agent's HealthPolicy, agent/health/health_check.h), --gpu_memory_wait, and the metrics endpoint
// (--metrics_port, --metrics_addr; agent/observe/metrics_server.h), the straggler report (--straggler_factor;
// agent/observe/straggler_watch.h) and the event log (--event_log_handler: torchrun's null, console,
// dynamic_rendezvous, and ddprun's file:PATH; agent/observe/lifecycle_log.h), and the training state in
// memory
// (--state_memory, --state_bandwidth; agent/state/state_keeper.h).
//
// Throws UsageError naming the flag and what it expects. Thread-safe (no state).
#pragma once

#include <functional>
#include <string>

#include "launcher/flag_values.h"

namespace ddprun::launcher {

struct LaunchConfig;

// Sets c.health, c.metrics_port, c.metrics_addr, c.straggler_factor, c.event_log_handler,
// c.event_log_file and c.state (its memory and bandwidth); `get` gives each flag's value (given, else its
// default).
void parse_operation_flags(const std::function<Given(const std::string&)>& get, LaunchConfig& c);

}  // namespace ddprun::launcher
