#include "agent/worker_launches.h"

#include <fcntl.h>

#include <cerrno>
#include <csignal>
#include <initializer_list>
#include <utility>

#include "agent/worker_env.h"

namespace ddprun::agent {

namespace {

// What hang detection and torch's FileTimer give a worker (agent/agent_config.h).
void add_watchdog_env(const AgentConfig& config, const WorkerLogPaths& p, Env& env) {
  if (file_timer_enabled(config)) env["TORCHELASTIC_TIMER_FILE"] = timer_file(config, p.run_dir).string();
  // Every rank's heartbeat file: its steps for hang detection, --max_no_progress_restarts and `ddprun
  // status`, its time before the first collective for the straggler report.
  env["DDPRUN_PROGRESS_FILE"] = p.progress_file.string();
  if (config.supervision.hang_timeout.count() > 0) {
    // torch's NCCL flight recorder (GPU jobs): record, dump on its own timeout into the rank's log directory,
    // and open the pipe through which the agent asks for a dump when it finds the group hung. Both names of
    // each setting: torch >= 2.8 reads TORCH_FR_* first and warns about the older TORCH_NCCL_* it still
    // takes (seen with torch 2.11). A user's own setting, under either name, wins.
    auto unless_set = [&env](std::initializer_list<const char*> names, const std::string& value) {
      for (const char* name : names) {
        if (env.count(name)) return;
      }
      for (const char* name : names) env[name] = value;
    };
    unless_set({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, "2000");
    unless_set({"TORCH_NCCL_DUMP_ON_TIMEOUT"}, "1");
    unless_set({"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}, p.nccl_trace_prefix.string());
    unless_set({"TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"},
               p.nccl_trace_pipe_prefix.string());
  }
  if (stack_capture_enabled(config)) {
    std::string hooks = LogLayout::python_hook_dir(p.run_dir).string();
    auto old = env.find("PYTHONPATH");
    env["PYTHONPATH"] = old == env.end() || old->second.empty() ? hooks : hooks + ":" + old->second;
    env["DDPRUN_STACK_SIGNAL"] = std::to_string(stack_dump_signal());
  }
}

}  // namespace

std::vector<WorkerLaunch> worker_launches(const AgentConfig& config, const rdzv::RendezvousInfo& info,
                                          const std::vector<WorkerLogPaths>& paths,
                                          const std::string& run_id) {
  const int nproc = static_cast<int>(config.workers.size());
  std::vector<WorkerLaunch> out;
  for (int lr = 0; lr < nproc; ++lr) {
    const auto& p = paths[static_cast<size_t>(lr)];
    const WorkerOutput& o = config.workers[static_cast<size_t>(lr)].output;
    WorkerIdentity who{.local_rank = lr,
                       .rank = info.rank_of(lr),
                       .local_world_size = nproc,
                       .world_size = 0,
                       .group_rank = info.group_rank,
                       .group_world_size = info.group_world_size,
                       .role = config.role};
    who.world_size = info.world_size;
    RoundEnv env{.master_addr = info.store_host,
                 .master_port = info.store_port,
                 // Every round is a new attempt for the workers (fresh "/worker/attempt_<n>" keys), also
                 // after a membership change that does not count against max_restarts.
                 .restart_count = info.round,
                 .max_restarts = config.supervision.max_restarts,
                 .run_id = run_id,
                 .use_agent_store = info.agent_store,
                 .error_file = p.error_file.string(),
                 .nccl_async_error_handling_var = config.nccl_async_error_handling_var};
    WorkerLaunch w;
    w.local_rank = lr;
    w.argv = config.workers[static_cast<size_t>(lr)].argv;
    w.env = worker_env(config.base_env, who, env, config.set_omp_threads);
    if (config.virtual_local_rank) apply_virtual_local_rank(config.base_env, lr, w.env);
    w.cpu_affinity = config.workers[static_cast<size_t>(lr)].cpu_affinity;
    add_watchdog_env(config, p, w.env);
    if (o.stdout_to_file) w.stdout_file = p.stdout_file;
    // torchrun's files only (agent/log_layout.h): stderr.log when -r/-t ask for it, and with hang detection
    // or the FileTimer, whose stack dumps and progress are read from it.
    if (o.stderr_to_file || stack_capture_enabled(config)) w.stderr_file = p.stderr_file;
    w.console_stdout = o.stdout_to_console;
    w.whole_lines = nproc > 1;  // several workers share the console: never interleave half lines
    w.console_stderr = o.stderr_to_console;
    // torch's TailLog: a tee'd stream's console lines carry the prefix; its --duplicate-*-filters tail the
    // tee'd streams (tee_stdouts: not the ranks --local_ranks_filter drops) with the same prefix.
    const std::string prefix = console_prefix(config, lr, who.rank);
    if (o.prefix_stdout) w.stdout_prefix = prefix;
    if (o.prefix_stderr) w.stderr_prefix = prefix;
    if (o.stdout_to_file && o.stdout_to_console && !config.duplicate_stdout_filters.empty())
      w.stdout_duplicate = {.filters = config.duplicate_stdout_filters, .file = nullptr, .prefix = prefix};
    if (o.stderr_to_file && o.stderr_to_console && !config.duplicate_stderr_filters.empty())
      w.stderr_duplicate = {.filters = config.duplicate_stderr_filters, .file = nullptr, .prefix = prefix};
    out.push_back(std::move(w));
  }
  return out;
}

WorkerGroup make_worker_group(const AgentConfig& config, const rdzv::RendezvousInfo& round,
                              const std::vector<WorkerLogPaths>& paths, const std::string& run_id) {
  WorkerGroup g;
  g.round = round;
  auto launches = worker_launches(config, round, paths, run_id);
  for (size_t lr = 0; lr < launches.size(); ++lr) {
    g.workers.push_back(Worker{.local_rank = static_cast<int>(lr),
                               .rank = round.rank_of(static_cast<int>(lr)),
                               .launch = std::move(launches[lr]),
                               .paths = paths[lr]});
  }
  return g;
}

void open_filtered_logs(const AgentConfig& config, const std::filesystem::path& attempt_dir,
                        WorkerGroup& group) {
  auto open = [&](const std::vector<std::string>& filters, const char* name,
                  DuplicateFilter WorkerLaunch::*member) {
    if (filters.empty()) return;
    const std::filesystem::path file = attempt_dir / name;
    // O_APPEND: the workers' pumps share it, each batch of lines one write().
    auto fd = std::make_shared<UniqueFd>(
        ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
    if (fd->get() < 0) {
      throw std::filesystem::filesystem_error("cannot create", file,
                                              std::error_code(errno, std::generic_category()));
    }
    for (Worker& w : group.workers) {
      if (!(w.launch.*member).filters.empty()) (w.launch.*member).file = fd;
    }
  };
  open(config.duplicate_stdout_filters, "filtered_stdout.log", &WorkerLaunch::stdout_duplicate);
  open(config.duplicate_stderr_filters, "filtered_stderr.log", &WorkerLaunch::stderr_duplicate);
}

}  // namespace ddprun::agent
