#include "launcher/rendezvous_options.h"

#include <cstdlib>
#include <memory>

#include "rendezvous/etcd/etcd_store.h"

namespace ddprun::launcher {
namespace {

rdzv::StaticRendezvousOptions static_options(const LaunchConfig& c) {
  const bool standalone = c.rdzv_kind == RendezvousKind::kStandalone;
  rdzv::StaticRendezvousOptions o;
  o.run_id = c.rdzv_id;
  o.node_rank = standalone ? 0 : c.node_rank;
  o.nnodes = c.max_nodes;
  o.master_addr = c.rdzv_endpoint.host;
  o.master_port = c.rdzv_endpoint.port;
  o.host_store = o.node_rank == 0;
  if (standalone) {
    o.bind_host = c.rdzv_endpoint.host;
    o.advertised_addr = kStandaloneMasterAddr;
  } else {
    o.bind_host = c.local_addr;  // --local_addr: node 0's store listens there only ("": every interface)
  }
  o.store_memory_budget = c.store_memory_budget;
  o.auth = c.store_auth;
  o.join_timeout = millis(c.rdzv_timings.join_timeout);
  o.connect_timeout = o.join_timeout;
  return o;
}

// What c10d and etcd-v2 share: the run, the node counts, the first endpoint, the timings, this node's
// address.
rdzv::DynamicRendezvousOptions dynamic_options(const LaunchConfig& c) {
  const RdzvTimings& t = c.rdzv_timings;
  rdzv::DynamicRendezvousOptions o;
  o.run_id = c.rdzv_id;
  o.min_nodes = c.min_nodes;
  o.max_nodes = c.max_nodes;
  o.endpoint_host = c.rdzv_endpoint.host;
  o.endpoint_port = c.rdzv_endpoint.port;
  o.join_timeout = millis(t.join_timeout);
  o.last_call_timeout = millis(t.last_call_timeout);
  o.close_timeout = millis(t.close_timeout);
  o.keep_alive_interval = millis(t.keep_alive_interval);
  o.keep_alive_max_attempt = t.keep_alive_max_attempt;
  o.read_timeout = millis(t.read_timeout);
  o.local_addr = c.local_addr;
  return o;
}

rdzv::DynamicRendezvousOptions c10d_options(const LaunchConfig& c) {
  rdzv::DynamicRendezvousOptions o = dynamic_options(c);
  o.is_host = c.is_host;
  o.fallback_endpoints = c.rdzv_fallbacks;
  o.failover = c.store_failover;
  o.store_memory_budget = c.store_memory_budget;
  o.auth = c.store_auth;
  return o;
}

rdzv::DynamicRendezvousOptions etcd_v2_options(const LaunchConfig& c) {
  rdzv::DynamicRendezvousOptions o = dynamic_options(c);
  o.failover = false;  // etcd replicates itself
  const rdzv::etcd::ClientOptions members = etcd_client_options(c, o.read_timeout);
  o.external_store = [members, prefix = etcd_v2_prefix(c.rdzv_id)](std::chrono::milliseconds request) {
    rdzv::etcd::ClientOptions client = members;
    client.request_timeout = request;
    return std::unique_ptr<rdzv::Store>(std::make_unique<rdzv::etcd::EtcdStore>(
        std::make_shared<rdzv::etcd::Client>(std::move(client)), prefix, request));
  };
  o.external_name = etcd_members_text(members);  // "the store at etcd http://e1:2379,e2:2379: ..."
  return o;
}

rdzv::etcd::EtcdRendezvousOptions etcd_options(const LaunchConfig& c) {
  const RdzvTimings& t = c.rdzv_timings;
  rdzv::etcd::EtcdRendezvousOptions o;
  o.run_id = c.rdzv_id;
  o.min_nodes = c.min_nodes;
  o.max_nodes = c.max_nodes;
  o.client = etcd_client_options(c, millis(t.read_timeout));
  o.prefix = c.etcd.prefix;
  o.join_timeout = millis(t.join_timeout);
  o.last_call_timeout = millis(t.last_call_timeout);
  o.local_addr = c.local_addr;
  o.role = c.role;
  return o;
}

}  // namespace

RendezvousOptions rendezvous_options(const LaunchConfig& c) {
  switch (c.rdzv_kind) {
    case RendezvousKind::kStatic:
    case RendezvousKind::kStandalone:
      return static_options(c);
    case RendezvousKind::kC10d:
      return c10d_options(c);
    case RendezvousKind::kEtcdV2:
      return etcd_v2_options(c);
    case RendezvousKind::kEtcd:
      return etcd_options(c);
  }
  std::abort();  // not a RendezvousKind
}

rdzv::etcd::ClientOptions etcd_client_options(const LaunchConfig& c,
                                              std::chrono::milliseconds request_timeout) {
  rdzv::etcd::ClientOptions o;
  o.endpoints.push_back(c.rdzv_endpoint);
  o.endpoints.insert(o.endpoints.end(), c.rdzv_fallbacks.begin(), c.rdzv_fallbacks.end());
  o.https = c.etcd.https;
  o.tls = {.ca_file = c.etcd.ca_file, .cert_file = c.etcd.cert_file, .key_file = c.etcd.key_file};
  o.request_timeout = request_timeout;
  return o;
}

std::string etcd_v2_prefix(const std::string& run_id) {
  return "/ddprun/etcd-v2/run_" + run_id;
}

std::string etcd_members_text(const rdzv::etcd::ClientOptions& client) {
  std::string text = "etcd ";
  for (size_t i = 0; i < client.endpoints.size(); ++i) {
    text += (i == 0 ? (client.https ? "https://" : "http://") : ",") + client.endpoints[i].to_string();
  }
  return text;
}

}  // namespace ddprun::launcher
