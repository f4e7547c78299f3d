// EtcdRendezvous, once a round is complete: what torch's agents exchange in the round's store (the workers'
// store address, the role infos and ranks, the exit barrier), and the watcher that sees the round end.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/etcd/etcd_state.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/etcd/lease_keeper.h"
#include "rendezvous/reachability.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv::etcd {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

namespace {

// torch's key names (agent/server/api.py, utils/store.py, rendezvous/api.py).
const std::string kRoleInfo113 = "torchelastic/role_info";  // + rank; + rank + ".FIN"
const std::string kRoleInfo2 = "torchelastic/role_info/";   // + rank
const std::string kAssignedRanks = "torchelastic/assigned_ranks/";
const std::string kTerminal =
    "torchelastic/agent/terminal_state";  // + rank (1.13); "/num_members", "/last_member"
const std::string kStop = "ddprun/stop";

struct RoleInfo {
  std::string role;
  int rank = 0;
  int local_world_size = 0;
};

}  // namespace

RendezvousInfo EtcdRendezvous::share_round(const Joined& joined, int local_world_size) {
  version_ = joined.version;
  rank_ = joined.rank;
  nodes_ = joined.nodes;
  const std::string kv_path = path("/rdzv/v_" + version_ + "/kv");
  create_dir(kv_path, std::nullopt);
  const milliseconds wait =
      std::max(duration_cast<milliseconds>(deadline_ - Clock::now()), milliseconds(30000));
  kv_ = std::make_unique<EtcdStore>(client_, kv_path, wait);
  watcher_kv_ = std::make_unique<EtcdStore>(watcher_client_, kv_path, wait);
  watch_index_ = 0;

  if (rank_ == 0) {  // torch's RendezvousStoreInfo.build / _set_master_addr_port
    std::string addr = options_.local_addr;
    if (addr.empty()) {
      const Endpoint& e = options_.client.endpoints.front();
      addr = source_address_towards(e.host, e.port);
    }
    if (addr.empty()) addr = local_hostname();
    kv_->set("MASTER_ADDR", addr);
    kv_->set("MASTER_PORT", std::to_string(free_tcp_port(is_local_host(addr) ? addr : "")));
  }

  const std::string me =
      json{{"role", options_.role}, {"rank", rank_}, {"local_world_size", local_world_size}}.dump();
  kv_->set(kRoleInfo113 + std::to_string(rank_), me);
  kv_->set(kRoleInfo2 + std::to_string(rank_), me);
  std::vector<std::vector<std::string>> groups;
  for (int i = 0; i < nodes_; ++i)
    groups.push_back({kRoleInfo2 + std::to_string(i), kRoleInfo113 + std::to_string(i)});
  std::vector<RoleInfo> infos;
  for (const EtcdStore::Found& f : kv_->wait_any(groups, wait)) {
    json j = json::parse(f.value, nullptr, false);
    const std::string key = groups[infos.size()][f.which];
    const bool ok = j.is_object() && j.contains("role") && j["role"].is_string() &&
                    j.contains("local_world_size") && j["local_world_size"].is_number_integer() &&
                    j["local_world_size"].get<int>() > 0;
    if (!ok) throw foreign(kv_->path(key), f.value, "not the role info a torch agent writes");
    infos.push_back(RoleInfo{j["role"], static_cast<int>(infos.size()), j["local_world_size"]});
  }

  RendezvousInfo info;
  // The round is the rendezvous version less one: the same on every node (a newcomer too), as c10d's global
  // round number; the workers' TORCHELASTIC_RESTART_COUNT. (torch counts each agent's own restarts instead.)
  info.round = static_cast<int>(parse_int(version_).value_or(1) - 1);
  info.group_rank = rank_;
  info.group_world_size = nodes_;
  info.base_rank = info.world_size = 0;
  std::map<std::string, int> role_sizes;
  for (const RoleInfo& r : infos) {
    if (r.rank < rank_) info.base_rank += r.local_world_size;
    info.world_size += r.local_world_size;
    role_sizes[r.role] += r.local_world_size;
  }
  if (rank_ == 0) {  // torch 2.x's agents read their ranks from node 0 (_assign_worker_ranks)
    std::vector<std::string> keys, values;
    std::map<std::string, int> role_ranks;
    int base = 0;
    for (const RoleInfo& r : infos) {
      keys.push_back(kAssignedRanks + std::to_string(r.rank));
      values.push_back(json::array({base, info.world_size, role_ranks[r.role], role_sizes[r.role]}).dump());
      base += r.local_world_size;
      role_ranks[r.role] += r.local_world_size;
    }
    kv_->multi_set(keys, values);
  }
  kv_->set(kRoleInfo113 + std::to_string(rank_) + ".FIN", "FIN");  // torch 1.13's node 0 waits for them

  info.store_host = kv_->get("MASTER_ADDR");
  const std::string port_text = kv_->get("MASTER_PORT");
  auto port = parse_port(port_text);
  if (!port || *port == 0) throw foreign(kv_->path("MASTER_PORT"), port_text, "not a port");
  info.store_port = *port;
  info.agent_store = false;
  return info;
}

std::optional<RoundStop> EtcdRendezvous::evaluate_round(uint64_t& index) {
  auto membership = [&](std::string why) {
    return RoundStop{.kind = RoundStop::Kind::kMembership, .node_rank = -1, .detail = std::move(why)};
  };
  State s;
  try {
    s = read_state(*watcher_client_);
  } catch (const EtcdKeyError& e) {
    if (e.code() != kKeyNotFound) throw;
    index = e.index();
    return membership("the etcd rendezvous state is gone (destroyed by a node that re-joins)");
  }
  // The watch goes on from the index of this first read: a change made between it and the reads below is
  // then seen by the next watch (the later reads' indexes would skip it).
  index = s.index();
  if (s.version() != version_ || (s.status() != "final" && s.status() != "closed")) {
    return membership("the etcd rendezvous moved on (version " + s.version() + ", " + s.status() + ")");
  }
  Response dir = watcher_client_->get(path("/rdzv/v_" + version_), GetOptions{.recursive = true});
  std::map<std::string, std::string> kv;  // etcd path -> raw value, the round's store
  std::vector<std::string> alive;
  for (const Node& n : dir.node.nodes) {
    alive.push_back(n.key);
    for (const Node& c : n.nodes) kv[c.key] = c.value;
  }
  if (auto it = kv.find(watcher_kv_->path(kStop)); it != kv.end()) {
    auto stop = decode_round_stop(base64_decode(it->second).value_or(""));
    if (!stop) throw foreign(it->first, it->second, "not a round stop ddprun writes");
    return stop;
  }
  bool done = kv.count(watcher_kv_->path(kTerminal + "/last_member")) > 0;
  if (!done) {
    done = true;
    for (int i = 0; i < nodes_ && done; ++i)
      done = kv.count(watcher_kv_->path(kTerminal + std::to_string(i))) > 0;
  }
  if (done) {
    watcher_kv_->set(kTerminal + std::to_string(rank_) + ".FIN", "FIN");
    return RoundStop{.kind = RoundStop::Kind::kDone, .node_rank = -1, .detail = "every node finished"};
  }
  for (const auto& k : s.j["keep_alives"]) {
    const std::string key = k.is_string() ? k.get<std::string>() : "";
    if (std::find(alive.begin(), alive.end(), key) == alive.end()) {
      return membership("node keep-alive " + key + " expired: a node of the round is lost");
    }
  }
  if (s.status() == "final" && s.j["num_workers_waiting"].get<int64_t>() > 0 && nodes_ < options_.max_nodes) {
    return membership(std::to_string(s.j["num_workers_waiting"].get<int64_t>()) + " node(s) wait to join");
  }
  return std::nullopt;
}

std::optional<RoundStop> EtcdRendezvous::do_wait_round_stopped(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto started = Clock::now();
    try {
      if (auto stop = evaluate_round(watch_index_)) return stop;
      unreachable_since_.reset();
      const auto left = duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      if (!watcher_client_->watch(path("/rdzv"), watch_index_ + 1, true, left)) return std::nullopt;
    } catch (const EtcdKeyError& e) {
      if (e.code() != kEventIndexCleared) throw;
      watch_index_ = e.index();
    } catch (const EtcdUnavailableError& e) {
      // No member answers (restarting, a network blip): ridden out for one request timeout (read_timeout),
      // as the dynamic backends ride out a silent store; then the round's store is lost.
      const auto now = Clock::now();
      if (!unreachable_since_) unreachable_since_ = started;  // the failed request began the silence
      if (now - *unreachable_since_ >= options_.client.request_timeout) {
        throw EtcdUnavailableError("etcd did not answer for " +
                                   duration_text(options_.client.request_timeout) +
                                   " (read_timeout); last error: " + e.what());
      }
      if (now >= deadline) return std::nullopt;
      std::this_thread::sleep_for(
          std::min<milliseconds>(milliseconds(200), duration_cast<milliseconds>(deadline - now)));
    }
  }
}

RoundStop EtcdRendezvous::do_stop_round(const RoundStop& stop) {
  if (!kv_) return stop;
  const std::string won = kv_->compare_set(kStop, "", encode_round_stop(stop));
  auto decoded = decode_round_stop(won);
  if (!decoded) throw foreign(kv_->path(kStop), won, "not a round stop ddprun writes");
  return *decoded;
}

void EtcdRendezvous::do_node_done() {
  // torch's exit barrier, in both dialects: 1.13 waits for every "<prefix><rank>", 2.x counts members.
  kv_->set(kTerminal + std::to_string(rank_), std::to_string(rank_));
  if (kv_->add(kTerminal + "/num_members", 1) == nodes_)
    kv_->set(kTerminal + "/last_member", "<val_ignored>");
}

void EtcdRendezvous::do_shutdown() {
  leases_.reset();
}

}  // namespace ddprun::rdzv::etcd
