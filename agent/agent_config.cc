#include "agent/agent_config.h"

#include <algorithm>
#include <csignal>

#include "agent/log_layout.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

int SupervisionPolicy::exit_code_of_signal(int sig) const {
  auto it = signal_exit_codes.find(sig);
  return it == signal_exit_codes.end() ? 128 + sig : it->second;
}

std::string console_prefix(const AgentConfig& config, int local_rank, int rank) {
  if (config.log_line_prefix_template.empty()) return "[" + config.role + std::to_string(local_rank) + "]:";
  return template_substitute(config.log_line_prefix_template, {{"role_name", config.role},
                                                               {"rank", std::to_string(rank)},
                                                               {"local_rank", std::to_string(local_rank)}});
}

bool file_timer_enabled(const AgentConfig& config) {
  auto it = config.base_env.find("TORCHELASTIC_ENABLE_FILE_TIMER");
  return it != config.base_env.end() && it->second == "1";
}

std::filesystem::path timer_file(const AgentConfig& config, const std::filesystem::path& run_dir) {
  auto it = config.base_env.find("TORCHELASTIC_TIMER_FILE");
  return it != config.base_env.end() && !it->second.empty() ? std::filesystem::path(it->second)
                                                            : LogLayout::timer_file(run_dir);
}

bool stack_capture_enabled(const AgentConfig& config) {
  return config.supervision.hang_timeout.count() > 0 || file_timer_enabled(config);
}

int stack_dump_signal() {
  return SIGRTMIN + 3;
}

uint64_t StatePolicy::own_quota(int local_world_size) const {
  return memory / static_cast<uint64_t>(std::max(local_world_size, 1)) / 2;
}

uint64_t StatePolicy::replica_quota(int local_world_size) const {
  return memory / static_cast<uint64_t>(std::max(local_world_size, 1)) / 2;
}

}  // namespace ddprun::agent
