// The rendezvous handler's options for a LaunchConfig: the one translation that a launch (launcher/main.cc
// constructs the handler from them) and --dry-run (launcher/dry_run.h prints their timeouts and etcd
// members) both use.
//
// Per backend (LaunchConfig::rdzv_kind):
//   kStatic      rdzv::StaticRendezvousOptions: node --node_rank of --nnodes (MAX), the store at
//                rdzv_endpoint, hosted by node 0; connect_timeout = join_timeout.
//   kStandalone  rdzv::StaticRendezvousOptions: node 0 of 1, hosting the store on rdzv_endpoint (127.0.0.1,
//                port 0: a free one), bound there; the workers' MASTER_ADDR is kStandaloneMasterAddr.
//   kC10d        rdzv::DynamicRendezvousOptions on ddprun's store at rdzv_endpoint: rdzv_fallbacks, is_host,
//                --rdzv_conf failover, --local_addr and --store_memory_budget passed on.
//   kEtcdV2      rdzv::DynamicRendezvousOptions on etcd: external_store makes an etcd::EtcdStore under
//                etcd_v2_prefix(rdzv_id) on etcd_client_options()' members, external_name is
//                etcd_members_text() of them; no failover, nothing hosted.
//   kEtcd        rdzv::etcd::EtcdRendezvousOptions: torch's protocol under --rdzv_conf etcd_prefix, on
//                etcd_client_options() (requests time out at read_timeout), --role and --local_addr.
// Every backend gets rdzv_id as run id and, where it has them, --nnodes MIN and MAX. Durations are
// LaunchConfig::rdzv_timings' seconds as milliseconds (millis()): join_timeout everywhere, last_call_timeout
// (c10d, etcd-v2, etcd), close_timeout, keep_alive_interval, keep_alive_max_attempt and read_timeout (c10d,
// etcd-v2). The agent's identity and host are left to the handler ("<hostname>:<pid>").
//
// Pure: no processes, sockets or files; thread-safe (no shared state). Nothing throws except std::bad_alloc.
// The etcd-v2 external_store factory touches nothing until the handler calls it; then the etcd client it
// makes connects lazily (its first request) and throws as etcd::Client's constructor does.
#pragma once

#include <chrono>
#include <string>
#include <variant>

#include "launcher/launch_config.h"
#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/static_rendezvous.h"

namespace ddprun::launcher {

// The options of the handler of each backend; which one is held follows LaunchConfig::rdzv_kind (above).
using RendezvousOptions = std::variant<rdzv::StaticRendezvousOptions, rdzv::DynamicRendezvousOptions,
                                       rdzv::etcd::EtcdRendezvousOptions>;

// The options of `c`'s rendezvous handler.
RendezvousOptions rendezvous_options(const LaunchConfig& c);

// etcd's members and how to reach them: rdzv_endpoint then rdzv_fallbacks, --rdzv_conf protocol and TLS
// files (LaunchConfig::etcd); one request waits up to `request_timeout`.
rdzv::etcd::ClientOptions etcd_client_options(const LaunchConfig& c,
                                              std::chrono::milliseconds request_timeout);

// Where etcd-v2 keeps the store of run `run_id`: "/ddprun/etcd-v2/run_<run_id>".
std::string etcd_v2_prefix(const std::string& run_id);

// etcd's members as messages name them: "etcd http://e1:2379,e2:2379" ("https://" with protocol=https).
std::string etcd_members_text(const rdzv::etcd::ClientOptions& client);

}  // namespace ddprun::launcher
