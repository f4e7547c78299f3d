#include "launcher/dry_run.h"

#include <cstring>
#include <sstream>

namespace ddprun::launcher {
namespace {

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);  // glibc >= 2.32
  return abbrev ? std::string("SIG") + abbrev : std::to_string(sig);
}

std::string format_seconds(double s) {
  std::ostringstream out;
  out << s << " s";
  return out.str();
}

// Where one stream of a worker ends up: bit `bit` of --redirects/--tee for its local rank.
std::string stream_destination(const LaunchConfig& c, int local_rank, int bit) {
  bool redirected = static_cast<int>(c.redirects.for_rank(local_rank)) & bit;
  bool teed = static_cast<int>(c.tee.for_rank(local_rank)) & bit;
  bool console = !redirected;
  bool file = redirected || teed;
  if (console && c.local_ranks_filter && !c.local_ranks_filter->count(local_rank)) console = false;
  if (console && file) return "console+file";
  if (file) return "file";
  return console ? "console" : "hidden (--local_ranks_filter)";
}

}  // namespace

bool is_plan_env_var(std::string_view name) {
  static const char* const kExact[] = {"RANK",
                                       "LOCAL_RANK",
                                       "GROUP_RANK",
                                       "ROLE_RANK",
                                       "ROLE_NAME",
                                       "LOCAL_WORLD_SIZE",
                                       "WORLD_SIZE",
                                       "GROUP_WORLD_SIZE",
                                       "ROLE_WORLD_SIZE",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "OMP_NUM_THREADS",
                                       "CUDA_VISIBLE_DEVICES"};
  static const char* const kPrefixes[] = {"TORCHELASTIC_", "TORCH_NCCL_", "DDPRUN_", "NCCL_"};
  for (const char* e : kExact) {
    if (name == e) return true;
  }
  for (const char* p : kPrefixes) {
    if (name.substr(0, std::strlen(p)) == p) return true;
  }
  return false;
}

std::string shell_quote(std::string_view arg) {
  static const char kSafe[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=./:,@%^";
  if (!arg.empty() && arg.find_first_not_of(kSafe) == std::string_view::npos) return std::string(arg);
  std::string out = "'";
  for (char ch : arg) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

std::string format_slurm_launch(const SlurmLaunch& s) {
  std::ostringstream out;
  const char* layout = s.settings.task_mode    ? "one agent per task"
                       : s.settings.batch_step ? "batch script"
                                               : "one agent per node";
  out << "  slurm:      "
      << (s.auto_detected ? "detected (SLURM_JOB_ID, SLURM_PROCID; --no_slurm ignores it)" : "--slurm")
      << ", job step " << s.settings.step_token << ", " << layout << ", "
      << (s.hosts_store ? "this agent hosts the store" : "the store is on " + s.store_host) << "\n";
  if (!s.probe_ports.empty()) {
    out << "              store port: first free of " << format_ports(s.probe_ports) << " on " << s.store_host
        << " (docs/slurm.md)\n";
  }
  for (const auto& d : s.used) out << "    " << d.setting << " " << d.value << "  <- " << d.source << "\n";
  return out.str();
}

std::string format_plan(const LaunchConfig& c, const Plan& plan) {
  std::ostringstream out;
  std::string nnodes_flag = c.min_nodes == c.max_nodes
                                ? std::to_string(c.min_nodes)
                                : std::to_string(c.min_nodes) + ":" + std::to_string(c.max_nodes);
  out << "ddprun dry run: nothing was started\n";
  out << "  rendezvous: " << c.rdzv_backend << (c.standalone ? " (standalone)" : "") << ", store "
      << plan.store_endpoint << ", run id " << c.rdzv_id << "\n";
  out << "  nodes:      node_rank " << plan.node_rank << " of " << plan.nnodes << " (--nnodes " << nnodes_flag
      << "), world size " << plan.world_size << "\n";
  out << "  workers:    " << plan.workers.size() << " on this node (--nproc_per_node " << c.nproc_spec
      << "), role " << c.role << ", max_restarts " << c.max_restarts << "\n";
  out << "  signals:    ";
  for (size_t i = 0; i < c.signals_to_handle.size(); ++i) {
    out << (i ? "," : "") << signal_name(c.signals_to_handle[i]);
  }
  out << " forwarded; SIGKILL after " << format_seconds(c.shutdown_timeout) << "\n";
  out << "  logs:       " << (c.log_dir.empty() ? std::string("(no --log_dir)") : c.log_dir) << "\n";
  if (c.slurm) out << format_slurm_launch(*c.slurm);
  for (const auto& w : plan.workers) {
    out << "worker local_rank " << w.local_rank << " (rank " << w.rank << "):\n";
    out << "  argv:";
    for (const auto& a : w.argv) out << " " << shell_quote(a);
    out << "\n";
    out << "  stdout: " << stream_destination(c, w.local_rank, 1)
        << ", stderr: " << stream_destination(c, w.local_rank, 2) << "\n";
    out << "  env:\n";
    for (const auto& [name, value] : w.env) {  // std::map: sorted by name
      if (is_plan_env_var(name)) out << "    " << name << "=" << value << "\n";
    }
  }
  return out.str();
}

}  // namespace ddprun::launcher
