#include "launcher/operation_flags.h"

#include "launcher/launch_config.h"

namespace ddprun::launcher {

namespace {
constexpr uint64_t kMinStateMemory = uint64_t{1} << 20;
constexpr uint64_t kMinStateBandwidth = uint64_t{64} << 10;
}  // namespace

std::optional<AuthMode> parse_auth_mode(const std::string& text) {
  if (text == "auto") return AuthMode::kAuto;
  if (text == "munge") return AuthMode::kMunge;
  if (text == "none") return AuthMode::kNone;
  return std::nullopt;
}

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

  c.rdzv_secret_file = trim(get("--rdzv_secret_file").text);
  c.rdzv_auth = *parse_auth_mode(one_of(get("--rdzv_auth"), {"auto", "munge", "none"}));

  c.state.memory = byte_size(get("--state_memory"), 0);
  if (c.state.memory > 0 && c.state.memory < kMinStateMemory) {
    fail(get("--state_memory"), "0 (off) or a size of at least 1M: bytes, or with a unit K, M, G (binary)");
  }
  c.state.bandwidth = byte_size(get("--state_bandwidth"), 0);
  if (c.state.bandwidth > 0 && c.state.bandwidth < kMinStateBandwidth) {
    fail(get("--state_bandwidth"), "0 (no cap) or at least 64K bytes per second (K, M, G: binary units)");
  }

  const Given factor = get("--straggler_factor");
  const std::optional<double> f = to_double(factor.text);
  if (!f || (*f != 0 && *f <= 1) || *f > 1000) fail(factor, "a factor above 1 (e.g. 1.5), or 0 for off");
  c.straggler_factor = *f;

  const Given handler = get("--event_log_handler");
  if (handler.text.starts_with("file:")) {
    c.event_log_handler = EventLogHandler::kNull;
    c.event_log_file = handler.text.substr(5);
    if (c.event_log_file.empty()) fail(handler, "file:PATH with a path (the JSON lines file to append to)");
    return;
  }
  const std::string name = one_of(handler, {"null", "console", "dynamic_rendezvous", "file:PATH"});
  c.event_log_handler = name == "console"              ? EventLogHandler::kConsole
                        : name == "dynamic_rendezvous" ? EventLogHandler::kDynamicRendezvous
                                                       : EventLogHandler::kNull;
}

}  // namespace ddprun::launcher
