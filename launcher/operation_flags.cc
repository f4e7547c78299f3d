#include "launcher/operation_flags.h"

#include "launcher/launch_config.h"

namespace ddprun::launcher {

void parse_operation_flags(const std::function<Given(const std::string&)>& get, LaunchConfig& c) {
  agent::HealthPolicy& h = c.health;
  h.command = trim(get("--health_check").text);
  const Given timeout = get("--health_check_timeout");
  h.command_timeout = millis(seconds(timeout));
  if (h.command_timeout.count() == 0) fail(timeout, "a number of seconds above 0");
  h.retry_interval = millis(seconds(get("--health_check_interval")));
  h.attempts = int_at_least(get("--health_check_attempts"), 1);
  h.builtin = one_of(get("--health_check_builtin"), {"on", "off"}) == "on";
  h.gpu_memory_wait = millis(seconds(get("--gpu_memory_wait")));
  c.metrics_port = parse_master_port(get("--metrics_port"));
  c.metrics_addr = trim(get("--metrics_addr").text);
}

}  // namespace ddprun::launcher
