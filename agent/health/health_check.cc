#include "agent/health/health_check.h"

#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "agent/process/run_command.h"
#include "rendezvous/util/shm_layout.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

using Clock = std::chrono::steady_clock;

void check_log_dir(const AgentConfig& config, std::vector<std::string>& problems) {
  if (config.log_dir.empty()) return;
  const std::string dir = config.log_dir.string();
  if (::access(dir.c_str(), W_OK) != 0) {
    problems.push_back("--log_dir " + dir + " is not writable: " + std::strerror(errno));
    return;
  }
  if (auto p = room_problem("--log_dir", dir, config.health.log_dir_min_free); !p.empty())
    problems.push_back(p);
}

void check_shm(const AgentConfig& config, std::vector<std::string>& problems) {
  const int n = static_cast<int>(config.workers.size());
  if (n < 2 || env_or(config.base_env, "DDPRUN_CPU_TRANSPORT", "") == "tcp") return;  // no segment then
  // The SDK's value (shm_layout.h); one it would refuse is its error at init, not this node's health.
  const auto slot = shm_slot_bytes(env_or(config.base_env, "DDPRUN_SHM_SLOT_BYTES"));
  if (!slot) return;
  const uint64_t need = ShmLayout(n, *slot).total_bytes;
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return;  // no /dev/shm: the SDK's TCP path runs instead
  if (auto p = room_problem("/dev/shm (the worker SDK's segment of " + std::to_string(n) + " local ranks)",
                            "/dev/shm", need);
      !p.empty())
    problems.push_back(p);
}

void check_gpus(const NodeGpus& gpus, Nvml& nvml, std::vector<std::string>& problems) {
  const int count = nvml.device_count();
  for (const auto& gpu : gpus.ids) {
    if (!gpus.listed && parse_uint(gpu).value_or(0) >= static_cast<uint64_t>(count)) continue;
    GpuState state = nvml.device(gpu);
    if (!state.ok) problems.push_back(state.problem);
  }
}

// Runs --health_check; its output goes to the log, line by line.
void check_command(const AgentConfig& config, const NodeGpus& gpus, std::vector<std::string>& problems) {
  const HealthPolicy& h = config.health;
  CommandRun run{.exe = "/bin/sh",
                 .argv = {"sh", "-c", h.command},
                 .env = config.base_env,
                 .deadline = h.command_timeout,
                 .capture_stdout = true,
                 .new_process_group = true};
  run.env["DDPRUN_HEALTH_GPUS"] = join(gpus.ids, ",");
  run.env["LOCAL_WORLD_SIZE"] = std::to_string(config.workers.size());
  std::string output;
  const int status = run_command(run, output);
  std::istringstream lines(output);
  std::string last;
  for (std::string line; std::getline(lines, line);) {
    spdlog::info("health check: {}", line);
    if (!line.empty()) last = line;
  }
  if (status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  problems.push_back("--health_check '" + h.command + "' " + command_outcome(status, h.command_timeout) +
                     (last.empty() ? "" : ": " + last));
}

}  // namespace

std::string HealthReport::summary() const {
  return join(problems, "; ");
}

NodeGpus node_gpus(const Env& env, int local_world_size) {
  NodeGpus gpus;
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  gpus.listed = it != env.end();
  if (gpus.listed) {
    for (auto& entry : split(it->second, ',')) {
      if (static_cast<int>(gpus.ids.size()) == local_world_size) break;
      if (!entry.empty()) gpus.ids.push_back(trim(entry));
    }
    return gpus;
  }
  for (int i = 0; i < local_world_size; ++i) gpus.ids.push_back(std::to_string(i));
  return gpus;
}

std::string room_problem(const std::string& what, const std::string& dir, uint64_t need) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return what + " " + dir + " cannot be read: " + std::strerror(errno);
  const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free >= need) return "";
  return what + " " + (what.find(dir) == std::string::npos ? dir + " " : "") + "has " + mib_text(free) +
         " free, " + mib_text(need) + " needed";
}

HealthReport check_health(const AgentConfig& config, Nvml* nvml) {
  HealthReport report;
  const auto start = Clock::now();
  const NodeGpus gpus = node_gpus(config.base_env, static_cast<int>(config.workers.size()));
  if (config.health.builtin) {
    check_log_dir(config, report.problems);
    check_shm(config, report.problems);
    if (nvml) check_gpus(gpus, *nvml, report.problems);
  }
  if (!config.health.command.empty()) check_command(config, gpus, report.problems);
  report.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  return report;
}

}  // namespace ddprun::agent
