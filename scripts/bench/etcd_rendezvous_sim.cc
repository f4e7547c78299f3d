// ddprun-etcd-rendezvous-sim: N simulated nodes meet through an etcd cluster, each node a thread of this
// process with a rendezvous handler of its own, as --rdzv_backend etcd or etcd-v2 builds it (launcher/main.cc
// make_etcd_rendezvous). A benchmark, not a test; scripts/bench-etcd-rendezvous.sh runs it.
//
//   ddprun-etcd-rendezvous-sim --backend etcd|etcd-v2 --nodes N --endpoints host:port[,host:port...]
//                              [--run-id X] [--timeout S]
//
// What it does, in order:
//   1. builds N handlers on the main thread (not timed; reported as setup_ms): `etcd` an EtcdRendezvous
//      (torch's legacy etcd protocol; its constructor creates the run's directories in etcd), `etcd-v2` a
//      DynamicRendezvous whose store is an EtcdStore under /ddprun/etcd-v2/run_<X>. min = max = N, so the
//      round closes when node N arrives (no last call). Node i is given the members rotated by i (its first
//      member is member i % M), so that the nodes spread over the cluster as N agents given the same
//      --rdzv_endpoint list in different orders would; a client sticks to the member that answered last;
//   2. starts one thread per node, parked on a gate, opens the gate, and each node calls
//      next_rendezvous(local world size 1 + i % 4), stamping steady_clock before and after;
//   3. verifies: round 0, N nodes, ranks 0..N-1 each once, base ranks = sum of the lower ranks' local world
//      sizes, one world size = the sum of them all;
//   4. prints one JSON line: wall_ms = last return - first join, phases as ddprun-rendezvous-sim's.
// ddprun's etcd next_rendezvous includes what torch's agent does after its handler returns (node 0 publishes
// MASTER_ADDR/PORT, the role infos and ranks in the round's EtcdStore): the etcd figure covers more than
// torch's handler alone does.
//
// Exit codes: 0 round complete and verified; 1 a node failed or timed out, or the check failed (the JSON
// line says why); 2 bad flags. Handlers are not shut down (their keys stay in etcd under the run id, which
// the script makes fresh per run): the process exits with std::_Exit once the line is printed.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <latch>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/store/endpoint.h"
#include "scripts/bench/fd_limit.h"

namespace ddprun::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string backend = "etcd";
  int nodes = 4;
  std::vector<rdzv::Endpoint> endpoints;
  std::string run_id = "sim";
  double timeout_s = 120;
};

int local_world_size(int idx) {
  return 1 + idx % 4;
}

// The members, rotated so that node `idx` tries member idx % M first.
std::vector<rdzv::Endpoint> rotated(const std::vector<rdzv::Endpoint>& members, int idx) {
  std::vector<rdzv::Endpoint> out = members;
  std::rotate(out.begin(), out.begin() + idx % static_cast<int>(out.size()), out.end());
  return out;
}

std::unique_ptr<rdzv::RendezvousHandler> make_node(const Options& o, int idx) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  const auto request = std::chrono::milliseconds(5000);
  const std::vector<rdzv::Endpoint> members = rotated(o.endpoints, idx);
  char id[32];
  std::snprintf(id, sizeof id, "node-%05d", idx);
  if (o.backend == "etcd") {
    rdzv::etcd::EtcdRendezvousOptions ro;
    ro.run_id = o.run_id;
    ro.min_nodes = o.nodes;
    ro.max_nodes = o.nodes;
    ro.client = rdzv::etcd::ClientOptions{.endpoints = members, .request_timeout = request};
    ro.join_timeout = timeout;
    ro.local_addr = "127.0.0.1";
    return std::make_unique<rdzv::etcd::EtcdRendezvous>(std::move(ro));
  }
  rdzv::DynamicRendezvousOptions ro;
  ro.run_id = o.run_id;
  ro.min_nodes = o.nodes;
  ro.max_nodes = o.nodes;
  ro.identity = id;
  ro.host = id;
  ro.endpoint_host = members.front().host;
  ro.endpoint_port = members.front().port;
  ro.local_addr = "127.0.0.1";
  ro.failover = false;
  ro.join_timeout = timeout;
  ro.read_timeout = request;
  ro.close_timeout = timeout;
  const std::string prefix = "/ddprun/etcd-v2/run_" + o.run_id;
  ro.external_store = [members, prefix](std::chrono::milliseconds t) -> std::unique_ptr<rdzv::Store> {
    auto client = std::make_shared<rdzv::etcd::Client>(
        rdzv::etcd::ClientOptions{.endpoints = members, .request_timeout = t});
    return std::make_unique<rdzv::etcd::EtcdStore>(client, prefix, t);
  };
  ro.external_name = "etcd at " + members.front().to_string();
  return std::make_unique<rdzv::DynamicRendezvous>(std::move(ro));
}

struct Result {
  rdzv::RendezvousInfo info;
  Clock::time_point t0, t1;
  std::string error;
};

// Checks the round; returns "" when it is right, else what is wrong.
std::string verify(const std::vector<Result>& results) {
  const int n = static_cast<int>(results.size());
  std::vector<int> lws_by_rank(results.size(), -1);
  for (size_t i = 0; i < results.size(); ++i) {
    const rdzv::RendezvousInfo& x = results[i].info;
    const std::string who = "node " + std::to_string(i);
    if (!results[i].error.empty()) return who + ": " + results[i].error;
    if (x.round != 0) return who + " got round " + std::to_string(x.round);
    if (x.group_world_size != n) return who + " got " + std::to_string(x.group_world_size) + " nodes";
    if (x.group_rank < 0 || x.group_rank >= n || lws_by_rank[static_cast<size_t>(x.group_rank)] != -1) {
      return "rank " + std::to_string(x.group_rank) + " given twice or out of range";
    }
    lws_by_rank[static_cast<size_t>(x.group_rank)] = local_world_size(static_cast<int>(i));
  }
  std::vector<int> base(results.size(), 0);
  for (size_t k = 1; k < base.size(); ++k) base[k] = base[k - 1] + lws_by_rank[k - 1];
  const int world = base.back() + lws_by_rank.back();
  for (size_t i = 0; i < results.size(); ++i) {
    const rdzv::RendezvousInfo& x = results[i].info;
    if (x.base_rank != base[static_cast<size_t>(x.group_rank)])
      return "rank " + std::to_string(x.group_rank) + ": wrong base rank";
    if (x.world_size != world)
      return "node " + std::to_string(i) + ": world size " + std::to_string(x.world_size);
  }
  return "";
}

int run(const Options& o) {
  raise_fd_limit();
  spdlog::set_level(spdlog::level::warn);
  nlohmann::json out = {{"backend", o.backend},          {"nodes", o.nodes},
                        {"min_nodes", o.nodes},          {"max_nodes", o.nodes},
                        {"members", o.endpoints.size()}, {"run_id", o.run_id}};
  std::vector<std::unique_ptr<rdzv::RendezvousHandler>> nodes;
  const auto setup_start = Clock::now();
  try {
    for (int i = 0; i < o.nodes; ++i) nodes.push_back(make_node(o, i));
  } catch (const std::exception& e) {
    out["ok"] = false;
    out["error"] = std::string("setup: ") + e.what();
    std::cout << out.dump() << std::endl;
    std::_Exit(1);
  }
  out["setup_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - setup_start).count();

  std::vector<Result> results(nodes.size());
  std::latch gate(1);
  std::mutex mutex;
  std::condition_variable returned;
  size_t finished = 0;  // guarded by mutex
  std::vector<std::thread> threads;
  for (size_t k = 0; k < nodes.size(); ++k) {
    threads.emplace_back([&, k] {
      gate.wait();
      results[k].t0 = Clock::now();
      try {
        results[k].info = nodes[k]->next_rendezvous(local_world_size(static_cast<int>(k)));
      } catch (const std::exception& e) {
        results[k].error = e.what();
      }
      results[k].t1 = Clock::now();
      std::lock_guard lock(mutex);
      if (++finished == nodes.size()) returned.notify_one();
    });
  }
  gate.count_down();
  // Every next_rendezvous is bounded by its join timeout; this bounds the whole round once more.
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000 + 30000));
  bool all = false;
  {
    std::unique_lock lock(mutex);
    all = returned.wait_until(lock, deadline, [&] { return finished == nodes.size(); });
  }
  std::string error;
  if (!all) {
    error = "not every node returned within --timeout";
  } else {
    for (auto& t : threads) t.join();
    error = verify(results);
    Clock::time_point first = results[0].t0, last_start = first, first_done = results[0].t1,
                      last_done = first;
    for (const Result& r : results) {
      first = std::min(first, r.t0);
      last_start = std::max(last_start, r.t0);
      first_done = std::min(first_done, r.t1);
      last_done = std::max(last_done, r.t1);
    }
    auto ms = [&](Clock::time_point t) {
      return std::chrono::duration<double, std::milli>(t - first).count();
    };
    out["wall_ms"] = ms(last_done);
    out["phases_ms"] = {{"last_node_started", ms(last_start)},
                        {"first_node_returned", ms(first_done)},
                        {"last_node_returned", ms(last_done)}};
  }
  out["ok"] = error.empty();
  if (!error.empty()) {
    std::replace(error.begin(), error.end(), '\n', ' ');
    out["error"] = error;
  }
  std::cout << out.dump() << std::endl;
  std::_Exit(error.empty() ? 0 : 1);  // skip stopping N lease and keep-alive threads one by one
}

}  // namespace
}  // namespace ddprun::bench

int main(int argc, char** argv) {
  CLI::App app{"ddprun-etcd-rendezvous-sim: N rendezvous nodes (threads) meet through etcd"};
  ddprun::bench::Options o;
  std::string endpoints;
  app.add_option("--backend", o.backend,
                 "etcd (torch's etcd protocol) or etcd-v2 (dynamic rendezvous on etcd)")
      ->check(CLI::IsMember({"etcd", "etcd-v2"}));
  app.add_option("--nodes", o.nodes, "Simulated nodes (min = max)")->check(CLI::Range(1, 4096));
  app.add_option("--endpoints", endpoints, "etcd members, host:port[,host:port...]")->required();
  app.add_option("--run-id", o.run_id, "Rendezvous id (fresh per run: keys are left behind)");
  app.add_option("--timeout", o.timeout_s, "Join timeout, seconds")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  std::stringstream list(endpoints);
  for (std::string item; std::getline(list, item, ',');) {
    std::string error;
    auto e = ddprun::rdzv::parse_endpoint(item, 2379, error);
    if (!e) {
      std::cerr << "ddprun-etcd-rendezvous-sim: --endpoints: " << error << "\n";
      return 2;
    }
    o.endpoints.push_back(*e);
  }
  if (o.endpoints.empty()) {
    std::cerr << "ddprun-etcd-rendezvous-sim: --endpoints: no member given\n";
    return 2;
  }
  return ddprun::bench::run(o);
}
