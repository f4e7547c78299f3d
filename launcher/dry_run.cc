#include "launcher/dry_run.h"

#include <cstring>
#include <initializer_list>
#include <sstream>
#include <variant>

#include "agent/log_layout.h"
#include "agent/process/worker_launch.h"  // signal_name
#include "agent/worker_launches.h"
#include "launcher/numa_topology.h"
#include "launcher/slurm/slurm_env.h"
#include "rendezvous/util/duration_text.h"

namespace ddprun::launcher {
namespace {

std::string format_seconds(double s) {
  return duration_text(std::chrono::duration<double>(s));
}

// The first round as the rendezvous would return it, where it is known (the rest is Plan::pending).
rdzv::RendezvousInfo first_round(const LaunchConfig& c) {
  const bool fixed = c.rdzv_kind == RendezvousKind::kStatic;
  rdzv::RendezvousInfo info;
  info.round = 0;
  info.group_rank = fixed ? c.node_rank : 0;
  info.group_world_size = fixed ? c.max_nodes : c.min_nodes;
  // Ranks as the rendezvous lays them out if every node runs this node's --nproc_per_node: exact on node 0
  // and with one node (Plan::pending says where else only the run decides).
  const rdzv::RankLayout layout =
      rdzv::rank_layout(std::vector<int>(info.group_world_size, c.nproc_per_node));
  info.base_rank = layout.base_ranks[static_cast<size_t>(info.group_rank)];
  info.world_size = layout.world_size;
  info.store_host = c.rdzv_kind == RendezvousKind::kStandalone ? kStandaloneMasterAddr : c.rdzv_endpoint.host;
  info.store_port = c.rdzv_endpoint.port;
  info.agent_store =
      !etcd_kind(c.rdzv_kind);  // etcd: the workers' rank 0 hosts their store, as under torchrun
  return info;
}

// The variables whose value only the run decides, and the placeholder shown instead.
std::map<std::string, std::string> pending_values(const LaunchConfig& c) {
  std::map<std::string, std::string> pending;
  auto at_rendezvous = [&pending](std::initializer_list<const char*> names) {
    for (const char* name : names) pending[name] = kDecidedAtRendezvous;
  };
  if (elastic_kind(c.rdzv_kind)) {
    at_rendezvous({"RANK", "ROLE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "WORLD_SIZE", "ROLE_WORLD_SIZE",
                   "MASTER_ADDR", "MASTER_PORT"});
    return pending;
  }
  if (c.max_nodes > 1) at_rendezvous({"WORLD_SIZE", "ROLE_WORLD_SIZE"});
  if (c.rdzv_kind == RendezvousKind::kStatic && c.node_rank > 0) at_rendezvous({"RANK", "ROLE_RANK"});
  if (c.slurm && !c.slurm->probe_ports.empty()) {
    pending["MASTER_PORT"] = "<probed among " + format_ports(c.slurm->probe_ports) + ">";
  } else if (c.rdzv_endpoint.port == 0) {
    pending["MASTER_PORT"] = kChosenAtBind;
  }
  return pending;
}

std::string store_text(const LaunchConfig& c, const std::map<std::string, std::string>& pending) {
  auto port = pending.find("MASTER_PORT");
  if (elastic_kind(c.rdzv_kind) || port == pending.end()) return c.rdzv_endpoint.to_string();
  const std::string& host = c.rdzv_endpoint.host;
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + port->second;
}

// The end of the etcd backends' rendezvous line (before the run id).
constexpr const char* kEtcdWorkersStore =
    "; the workers' store (MASTER_ADDR, MASTER_PORT): a free port of node 0, decided at the rendezvous";

std::string rendezvous_line(const LaunchConfig& c, const Plan& plan) {
  std::string line = "  rendezvous: ";
  switch (c.rdzv_kind) {
    case RendezvousKind::kStatic:
      line += "static, store " + plan.store + " on node 0" + (c.node_rank == 0 ? " (this node)" : "");
      break;
    case RendezvousKind::kStandalone:
      line += "c10d (standalone), store " + plan.store + " on this node";
      break;
    case RendezvousKind::kC10d:
      line +=
          "c10d, endpoint " + plan.store +
          (c.is_host ? (*c.is_host ? " (is_host: this agent hosts it)" : " (is_host=false: not here)") : "") +
          "; the workers' store (MASTER_ADDR, MASTER_PORT) is decided at the rendezvous";
      break;
    case RendezvousKind::kEtcd: {
      const auto& o = std::get<rdzv::etcd::EtcdRendezvousOptions>(plan.rendezvous);
      line += "etcd (torch's protocol, keys under " + o.prefix + "), " + etcd_members_text(o.client) +
              kEtcdWorkersStore;
      break;
    }
    case RendezvousKind::kEtcdV2:
      line += "etcd-v2 (ddprun's dynamic rendezvous on etcd), " +
              std::get<rdzv::DynamicRendezvousOptions>(plan.rendezvous).external_name + kEtcdWorkersStore;
      break;
  }
  return line + ", run id " + c.rdzv_id + "\n";
}

// "join 600 s, ...": the timeouts of the handler's options.
struct TimeoutsText {
  std::string operator()(const rdzv::StaticRendezvousOptions& o) const {
    return "join " + duration_text(o.join_timeout);
  }
  std::string operator()(const rdzv::DynamicRendezvousOptions& o) const {
    return "join " + duration_text(o.join_timeout) + ", last call " + duration_text(o.last_call_timeout) +
           ", close " + duration_text(o.close_timeout) + ", heartbeat every " +
           duration_text(o.keep_alive_interval) + " (" + std::to_string(o.keep_alive_max_attempt) +
           " missed: node lost), store reads " + duration_text(o.read_timeout);
  }
  std::string operator()(const rdzv::etcd::EtcdRendezvousOptions& o) const {
    return "join " + duration_text(o.join_timeout) + ", last call " + duration_text(o.last_call_timeout) +
           ", etcd requests " + duration_text(o.client.request_timeout);
  }
};

std::string nodes_line(const LaunchConfig& c, const Plan& plan) {
  const bool range = c.min_nodes != c.max_nodes;
  const std::string min = std::to_string(c.min_nodes), max = std::to_string(c.max_nodes);
  const std::string nnodes = range ? min + ":" + max : min;
  if (elastic_kind(c.rdzv_kind)) {
    return "  nodes:      " + (range ? min + " to " + max : min) + " (--nnodes " + nnodes +
           "); node rank, global ranks and world size decided at the rendezvous\n";
  }
  const int node_rank = c.rdzv_kind == RendezvousKind::kStatic ? c.node_rank : 0;
  std::string line = "  nodes:      node_rank " + std::to_string(node_rank) + " of " +
                     std::to_string(c.max_nodes) + " (--nnodes " + nnodes + "), world size ";
  const std::string world = std::to_string(plan.round.world_size);
  if (!plan.pending.count("WORLD_SIZE")) return line + world + "\n";
  return line + "decided at the rendezvous (" + world + " if every node runs " +
         std::to_string(c.nproc_per_node) + " workers)\n";
}

std::string logs_line(const Plan& plan) {
  const std::string dir = plan.run_dir.string();
  if (plan.run_dir_temporary) {
    return "  logs:       " + dir + " (temporary, removed when the job succeeds; --log_dir keeps it)\n";
  }
  return "  logs:       " + dir + " (the X's: random, chosen at start)\n";
}

// Where one stream of a worker goes, from its launch: "console (prefix [default0]:) + file PATH".
std::string stream_text(bool console, const std::filesystem::path& file, const std::string& prefix,
                        bool filtered_out) {
  std::string text;
  if (console) text = prefix.empty() ? "console" : "console (prefix " + prefix + ")";
  if (!file.empty()) text += (text.empty() ? "file " : " + file ") + file.string();
  if (text.empty()) text = filtered_out ? "discarded (--local_ranks_filter)" : "discarded";
  return text;
}

std::string worker_block(const LaunchConfig& c, const Plan& plan, const agent::WorkerLaunch& w) {
  std::ostringstream out;
  const bool filtered_out = c.local_ranks_filter && !c.local_ranks_filter->count(w.local_rank);
  out << "worker local_rank " << w.local_rank << " (rank "
      << (plan.pending.count("RANK") ? "decided at the rendezvous" : w.env.at("RANK")) << "):\n";
  out << "  argv:";
  for (const auto& a : w.argv) out << " " << shell_quote(a);
  out << "\n";
  out << "  stdout: " << stream_text(w.console_stdout, w.stdout_file, w.stdout_prefix, filtered_out) << "\n";
  out << "  stderr: " << stream_text(w.console_stderr, w.stderr_file, w.stderr_prefix, filtered_out) << "\n";
  if (!w.cpu_affinity.empty()) {
    out << "  cpus:   " << format_cpu_list({w.cpu_affinity.begin(), w.cpu_affinity.end()})
        << " (--numa-binding " << to_string(*c.numa_binding) << ")\n";
  }
  out << "  env:\n";
  for (const auto& [name, value] : w.env) {  // std::map: sorted by name
    if (!is_plan_env_var(name)) continue;
    auto p = plan.pending.find(name);
    out << "    " << name << "=" << (p != plan.pending.end() ? p->second : value) << "\n";
  }
  return out.str();
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

std::filesystem::path placeholder_run_dir(const agent::AgentConfig& a, const std::string& run_id,
                                          const std::filesystem::path& temp_dir) {
  // agent::LogLayout::create names it <log_dir>/<run_id>_<8 random characters>; without a log_dir the agent
  // makes mkdtemp("<temp dir>/ddprun-<run_id>-XXXXXX") (agent/loop/run_directory.h).
  if (!a.log_dir.empty()) return agent::LogLayout::absolute_log_dir(a.log_dir) / (run_id + "_XXXXXXXX");
  return temp_dir / ("ddprun-" + run_id + "-XXXXXX");
}

Plan make_plan(const LaunchConfig& c, const agent::AgentConfig& a, const std::filesystem::path& temp_dir) {
  Plan plan;
  plan.pending = pending_values(c);
  plan.store = store_text(c, plan.pending);
  plan.run_dir = placeholder_run_dir(a, c.rdzv_id, temp_dir);
  plan.run_dir_temporary = a.log_dir.empty();
  plan.round = first_round(c);
  plan.rendezvous = rendezvous_options(c);
  const agent::LogLayout layout(plan.run_dir);
  std::vector<agent::WorkerLogPaths> paths;
  for (int lr = 0; lr < static_cast<int>(a.workers.size()); ++lr)
    paths.push_back(layout.worker(plan.round.round, lr));
  plan.workers = agent::worker_launches(a, plan.round, paths, c.rdzv_id);
  return plan;
}

std::string format_plan(const LaunchConfig& c, const Plan& plan) {
  std::ostringstream out;
  out << "ddprun dry run: nothing was started\n";
  out << rendezvous_line(c, plan) << "  timeouts:   " << std::visit(TimeoutsText{}, plan.rendezvous) << "\n"
      << nodes_line(c, plan);
  out << "  workers:    " << plan.workers.size() << " on this node (--nproc_per_node " << c.nproc_spec
      << "), role " << c.role << ", max_restarts " << c.max_restarts << "\n";
  out << "  signals:    ";
  for (size_t i = 0; i < c.signals_to_handle.size(); ++i) {
    out << (i ? "," : "") << agent::signal_name(c.signals_to_handle[i]);
  }
  out << " forwarded; SIGKILL after " << format_seconds(c.shutdown_timeout) << "\n";
  out << logs_line(plan);
  if (c.slurm) out << format_slurm_launch(*c.slurm);
  for (const auto& w : plan.workers) out << worker_block(c, plan, w);
  return out.str();
}

std::string dry_run(const LaunchConfig& c, const LauncherContext& context) {
  return format_plan(c, make_plan(c, agent_config(c, context), context.temp_dir));
}

}  // namespace ddprun::launcher
