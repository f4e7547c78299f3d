#include "launcher/slurm/slurm_launch.h"

namespace ddprun::launcher {

void finish_slurm_launch(LaunchConfig& c, const std::function<bool(const std::string&)>& given,
                         bool master_port_given) {
  if (!c.slurm) return;
  SlurmLaunch& sl = *c.slurm;
  const bool c10d = elastic_kind(c.rdzv_kind);
  for (const auto& d : sl.settings.derived) {
    // c10d takes neither --master_addr/--master_port (the endpoint stands for them) nor --node_rank.
    bool ignored = c10d && (d.setting == "--master_addr" || d.setting == "--master_port" ||
                            d.setting == "--node_rank");
    if (!given(d.setting) && !ignored) sl.used.push_back(d);
  }
  sl.store_host = c.rdzv_endpoint.host;
  if (etcd_kind(c.rdzv_kind)) return;  // etcd is the user's: no port to probe, nobody here hosts it
  const bool port_given = given("--rdzv_endpoint") || (!c10d && master_port_given);
  if (!port_given) sl.probe_ports = sl.settings.ports;
  if (!c10d) {
    sl.hosts_store = c.node_rank == 0;
    return;
  }
  sl.hosts_store = c.is_host.value_or(sl.settings.node_rank == 0);  // given: the user decides who hosts
  if (port_given) return;
  sl.used.push_back({"--rdzv_endpoint", c.rdzv_endpoint.to_string(), "first host and SLURM_JOB_ID (port probed)"});
  if (!c.is_host) {
    c.is_host = sl.hosts_store;
    sl.used.push_back({"--rdzv_conf is_host", sl.hosts_store ? "true" : "false",
                       sl.settings.task_mode ? "SLURM_PROCID" : "SLURM_NODEID"});
  }
}

}  // namespace ddprun::launcher
