// Unit tests of launcher/rendezvous_options.h: a command line -> the options of its rendezvous handler, field
// by field, for every backend. Pure: no processes, no sockets (the etcd client connects lazily), no files.
#include "launcher/rendezvous_options.h"

#include <chrono>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "catch_compat.h"
#include "launch_config_test_util.h"
#include "rendezvous/etcd/etcd_store.h"

namespace {

using namespace ddprun::launcher;
using namespace std::chrono_literals;
using ddprun::rdzv::DynamicRendezvousOptions;
using ddprun::rdzv::Endpoint;
using ddprun::rdzv::StaticRendezvousOptions;
using ddprun::rdzv::etcd::EtcdRendezvousOptions;

LaunchConfig parse(const test::Args& args) {
  test::Outcome o = test::parse(args);
  INFO(o.result.message);
  REQUIRE_FALSE(o.result.should_exit);
  return o.config;
}

// The options `args` make, as alternative T (REQUIREd).
template <class T>
T options_of(const test::Args& args) {
  const RendezvousOptions options = rendezvous_options(parse(args));
  REQUIRE(std::holds_alternative<T>(options));
  return std::get<T>(options);
}

// The timings of a dynamic rendezvous (c10d, etcd-v2), in RdzvTimings' order.
struct Timings {
  std::chrono::milliseconds join, last_call, close, keep_alive_interval;
  int keep_alive_max_attempt;
  std::chrono::milliseconds read;
};

void check_timings(const DynamicRendezvousOptions& o, const Timings& t) {
  CHECK(o.join_timeout == t.join);
  CHECK(o.last_call_timeout == t.last_call);
  CHECK(o.close_timeout == t.close);
  CHECK(o.keep_alive_interval == t.keep_alive_interval);
  CHECK(o.keep_alive_max_attempt == t.keep_alive_max_attempt);
  CHECK(o.read_timeout == t.read);
}

}  // namespace

TEST_CASE("rendezvous options: static, node 0 of a fixed count hosts the store", "[launcher][rdzv_options]") {
  const auto o = options_of<StaticRendezvousOptions>(
      {"--nnodes", "3", "--master_addr", "10.0.0.1", "--master_port", "1234", "--rdzv_id", "job",
       "--rdzv_conf", "join_timeout=7", "--store_memory_budget", "64M", "t.py"});
  CHECK(o.run_id == "job");
  CHECK(o.node_rank == 0);
  CHECK(o.nnodes == 3);
  CHECK(o.master_addr == "10.0.0.1");
  CHECK(o.master_port == 1234);
  CHECK(o.host_store);
  CHECK(o.bind_host.empty());        // every interface
  CHECK(o.advertised_addr.empty());  // the workers' MASTER_ADDR is master_addr
  CHECK(o.store_memory_budget == size_t{64} << 20);
  CHECK(o.join_timeout == 7s);
  CHECK(o.connect_timeout == 7s);
}

TEST_CASE("rendezvous options: static, another node joins, MAX of a range, torch's timeout key",
          "[launcher][rdzv_options]") {
  const auto o =
      options_of<StaticRendezvousOptions>({"--nnodes", "2:4", "--node_rank", "3", "--rdzv_endpoint",
                                           "h0:29555", "--rdzv_conf", "timeout=45", "t.py"});
  CHECK(o.run_id == "none");
  CHECK(o.node_rank == 3);
  CHECK(o.nnodes == 4);  // torchrun's static backend runs MAX nodes
  CHECK(o.master_addr == "h0");
  CHECK(o.master_port == 29555);
  CHECK_FALSE(o.host_store);
  CHECK(o.store_memory_budget == size_t{256} << 20);  // the default --store_memory_budget
  CHECK(o.join_timeout == 45s);
  CHECK(o.connect_timeout == 45s);
  // torchrun's defaults without --rdzv_conf.
  CHECK(options_of<StaticRendezvousOptions>({"t.py"}).join_timeout == 600s);
  CHECK(options_of<StaticRendezvousOptions>({"t.py"}).bind_host.empty());  // every interface
  // --local_addr: node 0's store listens on that address only.
  CHECK(options_of<StaticRendezvousOptions>({"--local_addr", "10.0.0.9", "t.py"}).bind_host == "10.0.0.9");
}

TEST_CASE("rendezvous options: standalone, one node hosting its store on a free port of 127.0.0.1",
          "[launcher][rdzv_options]") {
  const auto o =
      options_of<StaticRendezvousOptions>({"--standalone", "--node_rank", "3", "--rdzv_id", "s", "t.py"});
  CHECK(o.run_id == "s");
  CHECK(o.node_rank == 0);  // --node_rank ignored, as torchrun does
  CHECK(o.nnodes == 1);
  CHECK(o.master_addr == "127.0.0.1");
  CHECK(o.master_port == 0);
  CHECK(o.host_store);
  CHECK(o.bind_host == "127.0.0.1");
  CHECK(o.advertised_addr == kStandaloneMasterAddr);
  CHECK(o.connect_timeout == o.join_timeout);
}

TEST_CASE("rendezvous options: c10d, every --rdzv_conf key and flag passed on", "[launcher][rdzv_options]") {
  const auto o = options_of<DynamicRendezvousOptions>(
      {"--nnodes", "2:4", "--rdzv_backend", "c10d", "--rdzv_endpoint", "10.0.0.1:29401,10.0.0.2", "--rdzv_id",
       "job", "--rdzv_conf",
       "join_timeout=7,last_call_timeout=2,close_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=9,"
       "read_timeout=11,is_host=true,failover=false",
       "--local_addr", "10.0.0.9", "--store_memory_budget", "1G", "t.py"});
  CHECK(o.run_id == "job");
  CHECK(o.min_nodes == 2);
  CHECK(o.max_nodes == 4);
  CHECK(o.endpoint_host == "10.0.0.1");
  CHECK(o.endpoint_port == 29401);
  CHECK(o.fallback_endpoints == std::vector<Endpoint>{{"10.0.0.2", 29400}});
  CHECK(o.is_host == true);
  CHECK_FALSE(o.failover);
  CHECK(o.local_addr == "10.0.0.9");
  CHECK(o.store_memory_budget == size_t{1} << 30);
  check_timings(o, {.join = 7s,
                    .last_call = 2s,
                    .close = 3s,
                    .keep_alive_interval = 1s,
                    .keep_alive_max_attempt = 9,
                    .read = 11s});
  // Left to the handler: "<hostname>:<pid>"; ddprun's own store, not an external one.
  CHECK(o.identity.empty());
  CHECK(o.host.empty());
  CHECK_FALSE(o.external_store);
  CHECK(o.external_name.empty());
}

TEST_CASE("rendezvous options: c10d's defaults, the heartbeat_timeout alias, an IPv6 endpoint",
          "[launcher][rdzv_options]") {
  const auto o = options_of<DynamicRendezvousOptions>({"--rdzv_backend", "c10d", "t.py"});
  CHECK(o.min_nodes == 1);
  CHECK(o.max_nodes == 1);
  CHECK(o.endpoint_host == "localhost");
  CHECK(o.endpoint_port == 29400);
  CHECK(o.fallback_endpoints.empty());
  CHECK_FALSE(o.is_host.has_value());  // the handler decides: is the endpoint an address of this machine?
  CHECK(o.failover);
  CHECK(o.local_addr.empty());
  CHECK(o.store_memory_budget == size_t{256} << 20);
  check_timings(o, {.join = 600s,
                    .last_call = 30s,
                    .close = 30s,
                    .keep_alive_interval = 5s,
                    .keep_alive_max_attempt = 3,
                    .read = 60s});  // torchrun's defaults
  const auto h = options_of<DynamicRendezvousOptions>({"--rdzv_backend", "c10d", "--rdzv_conf",
                                                       "heartbeat_timeout=7,keep_alive_interval=2",
                                                       "--rdzv_endpoint", "[::1]:7", "t.py"});
  CHECK(h.keep_alive_max_attempt == 4);  // ceil(7 / 2)
  CHECK(h.keep_alive_interval == 2s);
  CHECK(h.endpoint_host == "::1");
  CHECK(h.endpoint_port == 7);
}

TEST_CASE("rendezvous options: etcd-v2, the dynamic rendezvous on an EtcdStore", "[launcher][rdzv_options]") {
  const auto o = options_of<DynamicRendezvousOptions>(
      {"--nnodes", "1:3", "--rdzv_backend", "etcd-v2", "--rdzv_endpoint", "e1,e2:2380", "--rdzv_id", "r7",
       "--rdzv_conf",
       "join_timeout=9,last_call_timeout=4,close_timeout=5,keep_alive_interval=2,read_timeout=6",
       "--local_addr", "10.0.0.9", "t.py"});
  CHECK(o.run_id == "r7");
  CHECK(o.min_nodes == 1);
  CHECK(o.max_nodes == 3);
  CHECK(o.endpoint_host == "e1");  // the first member: this node's address towards it
  CHECK(o.endpoint_port == 2379);
  CHECK(o.fallback_endpoints.empty());  // the other members are the etcd client's
  CHECK_FALSE(o.failover);
  CHECK(o.local_addr == "10.0.0.9");
  check_timings(o, {.join = 9s,
                    .last_call = 4s,
                    .close = 5s,
                    .keep_alive_interval = 2s,
                    .keep_alive_max_attempt = 3,
                    .read = 6s});
  CHECK(o.external_name == "etcd http://e1:2379,e2:2380");
  // The store: the run's prefix, every member, the handler's request timeout. Nothing is sent yet.
  REQUIRE(o.external_store);
  const std::unique_ptr<ddprun::rdzv::Store> store = o.external_store(1500ms);
  auto* etcd = dynamic_cast<ddprun::rdzv::etcd::EtcdStore*>(store.get());
  REQUIRE(etcd != nullptr);
  CHECK(etcd->prefix() == "/ddprun/etcd-v2/run_r7/");
  CHECK(etcd->timeout() == 1500ms);
  const auto& client = etcd->client().options();
  CHECK(client.endpoints == std::vector<Endpoint>{{"e1", 2379}, {"e2", 2380}});
  CHECK_FALSE(client.https);
  CHECK(client.request_timeout == 1500ms);
}

TEST_CASE("rendezvous options: etcd, torch's protocol with its prefix, role and TLS",
          "[launcher][rdzv_options]") {
  const auto o = options_of<EtcdRendezvousOptions>(
      {"--nnodes", "2:4", "--rdzv_backend", "etcd", "--rdzv_endpoint", "e1,e2:2380", "--rdzv_id", "r",
       "--rdzv_conf", "protocol=https,etcd_prefix=/p,join_timeout=9,last_call_timeout=4,read_timeout=6",
       "--role", "trainer", "--local_addr", "10.0.0.9", "t.py"});
  CHECK(o.run_id == "r");
  CHECK(o.min_nodes == 2);
  CHECK(o.max_nodes == 4);
  CHECK(o.prefix == "/p");
  CHECK(o.join_timeout == 9s);
  CHECK(o.last_call_timeout == 4s);
  CHECK(o.local_addr == "10.0.0.9");
  CHECK(o.role == "trainer");
  CHECK(o.client.endpoints == std::vector<Endpoint>{{"e1", 2379}, {"e2", 2380}});
  CHECK(o.client.https);
  CHECK(o.client.request_timeout == 6s);  // read_timeout: one etcd request
  CHECK(etcd_members_text(o.client) == "etcd https://e1:2379,e2:2380");
  // torch's defaults.
  const auto d = options_of<EtcdRendezvousOptions>({"--rdzv_backend", "etcd", "t.py"});
  CHECK(d.prefix == "/torchelastic/p2p");
  CHECK(d.role == "default");
  CHECK(d.client.endpoints == std::vector<Endpoint>{{"localhost", 2379}});
  CHECK_FALSE(d.client.https);
  CHECK(d.join_timeout == 600s);
  CHECK(d.last_call_timeout == 30s);
  CHECK(d.client.request_timeout == 60s);
}

TEST_CASE("rendezvous options: etcd's client, TLS files and members", "[launcher][rdzv_options]") {
  LaunchConfig c;  // the files are checked by the parser; here they are only passed on
  c.rdzv_endpoint = {"m1", 2379};
  c.rdzv_fallbacks = {{"m2", 2379}, {"::1", 2381}};
  c.etcd = {.https = true, .ca_file = "/ca.pem", .cert_file = "/c.pem", .key_file = "/k.pem"};
  const auto client = etcd_client_options(c, 250ms);
  CHECK(client.endpoints == std::vector<Endpoint>{{"m1", 2379}, {"m2", 2379}, {"::1", 2381}});
  CHECK(client.https);
  CHECK(client.tls.ca_file == "/ca.pem");
  CHECK(client.tls.cert_file == "/c.pem");
  CHECK(client.tls.key_file == "/k.pem");
  CHECK(client.request_timeout == 250ms);
  CHECK(etcd_members_text(client) == "etcd https://m1:2379,m2:2379,[::1]:2381");
  CHECK(etcd_v2_prefix("j") == "/ddprun/etcd-v2/run_j");
}
