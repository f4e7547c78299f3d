#include "rendezvous/dynamic_rendezvous.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <thread>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "rendezvous/endpoint.h"
#include "rendezvous/text_util.h"

namespace ddprun::rdzv {

using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

namespace {

int to_int(const std::string& s, const std::string& what) {
  auto v = parse_int(s);
  if (!v || *v < INT_MIN || *v > INT_MAX) throw BadReplyError("rendezvous: unreadable " + what + " '" + s + "'");
  return static_cast<int>(*v);
}

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

}  // namespace

std::vector<int> order_nodes(const std::vector<std::string>& identities, const std::vector<int>& previous) {
  std::vector<size_t> idx(identities.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    bool na = previous[a] < 0, nb = previous[b] < 0;
    if (na != nb) return nb;  // members of the previous round first
    if (!na && previous[a] != previous[b]) return previous[a] < previous[b];
    return identities[a] < identities[b];
  });
  std::vector<int> rank(identities.size());
  for (size_t r = 0; r < idx.size(); ++r) rank[idx[r]] = static_cast<int>(r);
  return rank;
}

bool is_local_host(const std::string& host) {
  if (host == "localhost" || host == local_hostname()) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  std::vector<std::string> wanted;
  for (auto* p = res; p; p = p->ai_next) {
    std::string a = address_text(p->ai_addr);
    if (a.rfind("127.", 0) == 0 || a == "::1") {
      freeaddrinfo(res);
      return true;
    }
    wanted.push_back(a);
  }
  freeaddrinfo(res);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (auto* i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    std::string a = address_text(i->ifa_addr);
    found = !a.empty() && std::find(wanted.begin(), wanted.end(), a) != wanted.end();
  }
  freeifaddrs(ifs);
  return found;
}

DynamicRendezvous::DynamicRendezvous(DynamicRendezvousOptions options)
    : options_(std::move(options)), keys_(options_.run_id) {
  if (options_.host.empty()) options_.host = local_hostname();
  if (options_.identity.empty()) options_.identity = options_.host + ":" + std::to_string(::getpid());
  uint16_t port = options_.endpoint_port;
  bool host = options_.is_host.value_or(is_local_host(options_.endpoint_host));
  if (host) {
    try {
      StoreServerOptions so;
      so.port = options_.endpoint_port;
      server_ = std::make_unique<StoreServerThread>(so);
      port = server_->port();
      spdlog::info("rendezvous {}: hosting the store on {}", options_.run_id, server_->local_endpoint());
    } catch (const BindError& e) {
      if (options_.is_host.value_or(false)) throw;
      spdlog::info("rendezvous {}: {} is in use on this host; joining the agent that hosts it", options_.run_id,
                   format_endpoint(options_.endpoint_host, port));
    }
  }
  options_.endpoint_port = port;
  StoreClientOptions co;
  co.connect_timeout = options_.join_timeout;
  co.timeout = options_.read_timeout;
  store_ = std::make_shared<StoreClient>(options_.endpoint_host, port, co);
  watcher_ = std::make_unique<StoreClient>(options_.endpoint_host, port, co);
}

DynamicRendezvous::~DynamicRendezvous() = default;

int DynamicRendezvous::current_round() {
  if (!store_->check({key("round")})) return 0;
  return to_int(store_->get(key("round")), "round");
}

void DynamicRendezvous::sit_out_if_failing() {
  if (options_.min_nodes == options_.max_nodes) return;  // nobody could replace this node
  int64_t failures = store_->add(key("failures/" + options_.host), 0);
  if (failures < 2) return;
  auto cooldown = options_.cooldown_base * (int64_t{1} << std::min<int64_t>(failures - 2, 20));
  cooldown = std::min(cooldown, options_.cooldown_max);
  spdlog::warn("rendezvous {}: the workers on {} caused {} failures; keeping this node out for {} s (the cooldown "
               "doubles with each further failure)",
               options_.run_id, options_.host, failures, cooldown.count() / 1000);
  std::this_thread::sleep_for(cooldown);
}

void DynamicRendezvous::note_local_failure() { store_->add(key("failures/" + options_.host), 1); }

void DynamicRendezvous::wait_closed_or_close(int r, int64_t index) {
  const int min = options_.min_nodes, max = options_.max_nodes;
  const std::string closed = round_key(r, "closed");
  const std::string joined = round_key(r, "joined");
  auto close = [&](int64_t count) {
    count = std::min<int64_t>(count, max);
    std::string won = store_->compare_set(closed, "", std::to_string(count));
    if (won != std::to_string(count)) return;  // someone else closed it
    // This node closes the round: it alone reads the descriptors and assigns every node its rank.
    std::vector<std::string> node_keys;
    for (int64_t i = 0; i < count; ++i) node_keys.push_back(round_key(r, "node/" + std::to_string(i)));
    auto descs = store_->multi_get(node_keys);
    std::vector<std::string> ids;
    std::vector<int> prev, lws;
    for (const auto& d : descs) {
      auto f = split(d, '|');
      if (f.size() != 3) throw BadReplyError("rendezvous: unreadable node descriptor '" + d + "'");
      ids.push_back(f[0]);
      prev.push_back(to_int(f[1], "previous rank"));
      lws.push_back(to_int(f[2], "local world size"));
    }
    auto rank = order_nodes(ids, prev);
    std::vector<int> by_rank(static_cast<size_t>(count));
    for (size_t i = 0; i < rank.size(); ++i) by_rank[static_cast<size_t>(rank[i])] = lws[i];
    std::vector<int> base(static_cast<size_t>(count), 0);
    for (size_t k = 1; k < by_rank.size(); ++k) base[k] = base[k - 1] + by_rank[k - 1];
    int world = std::accumulate(by_rank.begin(), by_rank.end(), 0);
    std::vector<std::string> keys, values;
    for (size_t i = 0; i < rank.size(); ++i) {
      keys.push_back(round_key(r, "assign/" + std::to_string(i)));
      values.push_back(std::to_string(rank[i]) + "|" + std::to_string(count) + "|" +
                       std::to_string(base[static_cast<size_t>(rank[i])]) + "|" + std::to_string(world));
    }
    keys_.open_worker_keyspace(*store_, r);
    store_->multi_set(keys, values);
    store_->set(key("round"), std::to_string(r));
    spdlog::info("rendezvous {} round {}: closed with {} nodes ({} workers)", options_.run_id, r, count, world);
  };

  if (index + 1 == min) {
    // Last call: wait for more nodes up to max, or until the round is full.
    if (max > min) {
      spdlog::info("rendezvous {} round {}: {} nodes joined (min {}), last call for up to {} more for {} s",
                   options_.run_id, r, min, min, max - min, options_.last_call_timeout.count() / 1000.0);
      try {
        store_->wait({round_key(r, "full")}, options_.last_call_timeout);
      } catch (const TimeoutError&) {
      }
    }
    close(store_->add(joined, 0));
    return;
  }
  const auto start = Clock::now();
  const auto deadline = start + options_.join_timeout;
  int64_t k = index + 1;  // nodes known to have joined
  while (true) {
    auto left = duration_cast<milliseconds>(deadline - Clock::now());
    try {
      try {
        store_->wait({closed}, std::max(milliseconds(1), std::min(left, options_.progress_interval)));
        return;
      } catch (const TimeoutError&) {
      }
      k = store_->add(joined, 0);
    } catch (const ConnectionLostError& e) {
      // Only the store host's agent can take the store away before the round completes: it gave up waiting
      // (its join timeout, usually a little ahead of ours) or was stopped. Report the timeout, not the
      // socket.
      throw RendezvousTimeoutError(
          "rendezvous '" + options_.run_id + "' round " + std::to_string(r) + ": the store at " +
          store_->endpoint() + " went away while this node waited for at least " + std::to_string(min) +
          " nodes (" + std::to_string(k) + " had joined): the agent hosting it gave up, most likely at its " +
          "join timeout (" + std::to_string(options_.join_timeout.count() / 1000) +
          " s here). Start every node within join_timeout of the first, with the same --rdzv_endpoint and "
          "--rdzv_id, or lower --nnodes MIN (" + e.what() + ")");
    }
    if (Clock::now() >= deadline) {
      std::string names;
      int64_t shown = std::min<int64_t>(k, 16);
      std::vector<std::string> node_keys;
      for (int64_t i = 0; i < shown; ++i) node_keys.push_back(round_key(r, "node/" + std::to_string(i)));
      for (const auto& d : store_->multi_get(node_keys)) names += (names.empty() ? "" : ", ") + split(d, '|')[0];
      if (k > shown) names += ", ...";
      throw RendezvousTimeoutError("rendezvous '" + options_.run_id + "' round " + std::to_string(r) + ": only " +
                                   std::to_string(k) + " of at least " + std::to_string(min) +
                                   " nodes joined within " + std::to_string(options_.join_timeout.count() / 1000) +
                                   " s at " + store_->endpoint() + " (joined: " + names +
                                   "). Start more nodes with the same --rdzv_endpoint and --rdzv_id, or lower "
                                   "--nnodes MIN");
    }
    if (k >= min && Clock::now() - start > options_.last_call_timeout + options_.close_timeout) {
      spdlog::warn("rendezvous {} round {}: the node running the last call vanished; closing the round", options_.run_id, r);
      close(k);
      continue;
    }
    spdlog::info("rendezvous {} round {}: {}/{} joined (max {}), waiting for {} at {}", options_.run_id, r, k, min, max,
                 k < min ? "more nodes" : "the last call to end", store_->endpoint());
  }
}

RendezvousInfo DynamicRendezvous::next_rendezvous(int local_world_size) {
  auto closed_error = [&] {
    return RendezvousClosedError("rendezvous '" + options_.run_id + "' at " + store_->endpoint() +
                                 " is closed: the job already finished; start a new job with a new --rdzv_id");
  };
  if (is_closed()) throw closed_error();
  sit_out_if_failing();
  int r = std::max(round_.load() + 1, current_round());
  const auto deadline = Clock::now() + options_.join_timeout;
  for (bool first = true;; first = false) {
    if (!first && is_closed()) throw closed_error();
    int64_t index = store_->add(round_key(r, "joined"), 1) - 1;
    store_->set(round_key(r, "node/" + std::to_string(index)),
                options_.identity + "|" + std::to_string(previous_rank_) + "|" + std::to_string(local_world_size));
    if (index + 1 == options_.max_nodes) store_->set(round_key(r, "full"), "1");
    if (index < options_.max_nodes) wait_closed_or_close(r, index);
    int64_t count = index < options_.max_nodes ? to_int(store_->get(round_key(r, "closed")), "node count")
                                               : options_.max_nodes;
    if (index < count) {
      const std::string assign = round_key(r, "assign/" + std::to_string(index));
      try {
        store_->wait({assign}, options_.close_timeout);
      } catch (const TimeoutError&) {
        spdlog::warn("rendezvous {} round {}: no rank assignment within {} s; starting a new round", options_.run_id, r,
                     options_.close_timeout.count() / 1000);
        stop_round_at(r, RoundStop{RoundStop::Kind::kMembership, -1, "closer vanished", 0});
        ++r;
        continue;
      }
      auto f = split(store_->get(assign), '|');
      if (f.size() != 4) throw BadReplyError("rendezvous: unreadable assignment");
      RendezvousInfo info;
      info.round = r;
      info.group_rank = to_int(f[0], "rank");
      info.group_world_size = to_int(f[1], "node count");
      info.base_rank = to_int(f[2], "base rank");
      info.world_size = to_int(f[3], "world size");
      info.store_host = options_.endpoint_host;
      info.store_port = options_.endpoint_port;
      rank_ = previous_rank_ = info.group_rank;
      nodes_ = info.group_world_size;
      neighbour_beats_ = -1;
      neighbour_seen_ = next_beat_ = Clock::now();
      round_ = r;
      return info;
    }
    // Too late for round r.
    if (count < options_.max_nodes) {
      spdlog::info("rendezvous {}: round {} runs with {} nodes and has room; asking it to re-form with this node",
                   options_.run_id, r, count);
      stop_round_at(r, RoundStop{RoundStop::Kind::kMembership, -1, "node " + options_.identity + " arrived", 0});
    } else {
      spdlog::warn(
          "rendezvous {}: round {} is running and full ({} nodes = max); waiting for it to end to join the "
          "next one. If this agent starts a new job, another job with --rdzv_id {} is still running at {}: "
          "give the new job its own --rdzv_id",
          options_.run_id, r, count, options_.run_id, store_->endpoint());
      // The job this node waits to join may finish instead of re-forming: then there is no next round, and
      // the agent that hosts the store leaves with it. Either way this agent joined another job's run id.
      auto finished = [&](const std::string& how) {
        return RendezvousClosedError(
            "rendezvous '" + options_.run_id + "' at " + store_->endpoint() +
            ": the job running with this --rdzv_id (round " + std::to_string(r) + ", " +
            std::to_string(count) + " nodes = max) " + how +
            " while this agent waited for a place in it. If this agent belongs to a new "
            "job, that job reuses the --rdzv_id and endpoint of a running one: give it a "
            "new --rdzv_id (or another port)");
      };
      const std::string stop_key = round_key(r, "stop");
      std::optional<RoundStop> stop;
      try {
        auto left = duration_cast<milliseconds>(deadline - Clock::now());
        store_->wait({stop_key}, std::max(milliseconds(1), left));
        stop = decode_round_stop(store_->get(stop_key));
      } catch (const TimeoutError&) {
        throw RendezvousTimeoutError("rendezvous '" + options_.run_id + "': round " + std::to_string(r) +
                                     " stayed full (" + std::to_string(count) + " nodes = max) for " +
                                     std::to_string(options_.join_timeout.count() / 1000) + " s at " +
                                     store_->endpoint());
      } catch (const ConnectionLostError& e) {
        throw finished("ended (the store went away: " + std::string(e.what()) + ")");
      }
      if (stop && stop->kind == RoundStop::Kind::kDone) throw finished("finished");
    }
    ++r;
  }
}

RoundStop DynamicRendezvous::stop_round_at(int round, const RoundStop& stop) {
  return keys_.stop(*store_, round, stop);
}

RoundStop DynamicRendezvous::stop_round(const RoundStop& stop) { return stop_round_at(round_.load(), stop); }

void DynamicRendezvous::heartbeat_and_check() {
  int r = round_.load();
  if (nodes_ <= 1 || rank_ < 0) return;
  watcher_->add(round_key(r, "hb/" + std::to_string(rank_)), 1);
  int neighbour = (rank_ + 1) % nodes_;
  int64_t beats = watcher_->add(round_key(r, "hb/" + std::to_string(neighbour)), 0);
  auto now = Clock::now();
  if (beats != neighbour_beats_) {
    neighbour_beats_ = beats;
    neighbour_seen_ = now;
    return;
  }
  auto silent = duration_cast<milliseconds>(now - neighbour_seen_);
  if (silent > options_.keep_alive_interval * options_.keep_alive_max_attempt) {
    std::string detail = "node " + std::to_string(neighbour) + " stopped heartbeating for " +
                         std::to_string(silent.count() / 1000.0).substr(0, 4) + " s";
    spdlog::warn("rendezvous {} round {}: {}; re-forming without it", options_.run_id, r, detail);
    keys_.stop(*watcher_, r, RoundStop{RoundStop::Kind::kMembership, rank_, detail, 0});
  }
}

std::optional<RoundStop> DynamicRendezvous::wait_round_stopped(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const int r = round_.load();
  while (true) {
    auto now = Clock::now();
    if (now >= next_beat_) {
      heartbeat_and_check();
      next_beat_ = now + options_.keep_alive_interval;
    }
    auto until = std::min(deadline, next_beat_);
    auto stop = keys_.wait_stopped(*watcher_, r, std::max(milliseconds(1), duration_cast<milliseconds>(until - now)));
    if (stop || Clock::now() >= deadline) return stop;
  }
}

std::vector<int> DynamicRendezvous::unresponsive_nodes() {
  int r = round_.load();
  if (nodes_ <= 1) return {};
  auto read_all = [&] {
    std::vector<int64_t> beats;
    for (int i = 0; i < nodes_; ++i) beats.push_back(store_->add(round_key(r, "hb/" + std::to_string(i)), 0));
    return beats;
  };
  auto before = read_all();
  std::this_thread::sleep_for(options_.keep_alive_interval + options_.keep_alive_interval / 2);
  auto after = read_all();
  std::vector<int> dead;
  for (int i = 0; i < nodes_; ++i) {
    if (i != rank_ && after[static_cast<size_t>(i)] == before[static_cast<size_t>(i)]) dead.push_back(i);
  }
  return dead;
}

void DynamicRendezvous::node_done() { keys_.done(*store_, round_.load(), nodes_, rank_); }

void DynamicRendezvous::set_closed() { keys_.set_closed(*store_); }

bool DynamicRendezvous::is_closed() { return keys_.is_closed(*store_); }

void DynamicRendezvous::shutdown() {
  keys_.leave(*store_, round_.load(), nodes_, server_ != nullptr);
  store_->close();
  watcher_->close();
  if (server_) server_->stop();
}

}  // namespace ddprun::rdzv
