#include "rendezvous/static_rendezvous.h"

#include <charconv>

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "rendezvous/endpoint.h"

namespace ddprun::rdzv {

using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

// ---- RoundStop encoding: "<kind>|<node_rank>|<exit_code>|<detail>" ----------------------------------------

std::string encode_round_stop(const RoundStop& stop) {
  const char* kind = stop.kind == RoundStop::Kind::kDone       ? "done"
                     : stop.kind == RoundStop::Kind::kFailed   ? "failed"
                     : stop.kind == RoundStop::Kind::kShutdown ? "shutdown"
                                                               : "membership";
  return std::string(kind) + "|" + std::to_string(stop.node_rank) + "|" + std::to_string(stop.exit_code) + "|" +
         stop.detail;
}

std::optional<RoundStop> decode_round_stop(std::string_view text) {
  RoundStop s;
  auto next = [&](std::string_view& field) {
    auto bar = text.find('|');
    if (bar == std::string_view::npos) return false;
    field = text.substr(0, bar);
    text.remove_prefix(bar + 1);
    return true;
  };
  std::string_view kind, node, code;
  if (!next(kind) || !next(node) || !next(code)) return std::nullopt;
  if (kind == "done") {
    s.kind = RoundStop::Kind::kDone;
  } else if (kind == "failed") {
    s.kind = RoundStop::Kind::kFailed;
  } else if (kind == "shutdown") {
    s.kind = RoundStop::Kind::kShutdown;
  } else if (kind == "membership") {
    s.kind = RoundStop::Kind::kMembership;
  } else {
    return std::nullopt;
  }
  if (std::from_chars(node.data(), node.data() + node.size(), s.node_rank).ec != std::errc()) return std::nullopt;
  if (std::from_chars(code.data(), code.data() + code.size(), s.exit_code).ec != std::errc()) return std::nullopt;
  s.detail = std::string(text);
  return s;
}

// ---- StaticRendezvous ------------------------------------------------------------------------------------

namespace {

std::string agent_identity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(::getpid());
}

}  // namespace

StaticRendezvous::StaticRendezvous(StaticRendezvousOptions options)
    : options_(std::move(options)), keys_(options_.run_id) {
  std::string connect_host = options_.master_addr;
  port_ = options_.master_port;
  if (options_.host_store) {
    StoreServerOptions so;
    so.host = options_.bind_host;
    so.port = options_.master_port;
    server_ = std::make_unique<StoreServerThread>(so);  // BindError names addr:port
    port_ = server_->port();
    spdlog::info("rendezvous {}: hosting the store on {}", options_.run_id, server_->local_endpoint());
  }
  StoreClientOptions co;
  co.connect_timeout = options_.connect_timeout;
  co.timeout = options_.join_timeout;
  store_ = std::make_shared<StoreClient>(connect_host, port_, co);
  watcher_ = std::make_unique<StoreClient>(connect_host, port_, co);
}

StaticRendezvous::~StaticRendezvous() = default;

RendezvousInfo StaticRendezvous::next_rendezvous(int local_world_size) {
  if (is_closed()) {
    throw RendezvousClosedError("rendezvous '" + options_.run_id + "' at " + store_->endpoint() +
                                " is closed: the job already finished; start a new job with a new --rdzv_id");
  }
  const int n = options_.nnodes;
  const int r = round_.load() + 1;
  const std::string me = agent_identity();
  // A second agent with the same --node_rank would make the round complete without a real node.
  std::string owner = store_->compare_set(round_key(r, "node/" + std::to_string(options_.node_rank)), "", me);
  if (owner != me) {
    throw RendezvousClosedError("rendezvous '" + options_.run_id + "': --node_rank " +
                                std::to_string(options_.node_rank) + " is already taken by agent " + owner +
                                "; give every node a distinct --node_rank in 0.." + std::to_string(n - 1));
  }
  store_->set(round_key(r, "lws/" + std::to_string(options_.node_rank)), std::to_string(local_world_size));
  int64_t joined = store_->add(round_key(r, "joined"), 1);
  if (joined == n) {
    keys_.open_worker_keyspace(*store_, r);
    store_->set(round_key(r, "complete"), "1");
  }

  const std::string complete = round_key(r, "complete");
  const auto deadline = Clock::now() + options_.join_timeout;
  while (true) {
    auto left = duration_cast<milliseconds>(deadline - Clock::now());
    try {
      try {
        store_->wait({complete}, std::max(milliseconds(1), std::min(left, options_.progress_interval)));
        break;
      } catch (const TimeoutError&) {
      }
      joined = store_->add(round_key(r, "joined"), 0);
    } catch (const ConnectionLostError& e) {
      // Node 0's agent hosts the store; it leaves before the round completes only when it gave up waiting
      // (its join timeout, usually a little ahead of ours) or was stopped. Report the timeout, not the
      // socket.
      throw RendezvousTimeoutError(
          "rendezvous '" + options_.run_id + "' round " + std::to_string(r) + ": the store at " +
          store_->endpoint() + " (node 0's agent) went away while this node waited for the other nodes (" +
          std::to_string(joined) + " of " + std::to_string(n) + " had joined): node 0 gave up, most likely " +
          "at its join timeout (" + std::to_string(options_.join_timeout.count() / 1000) +
          " s here). Start ddprun on every node within join_timeout of the first, with --nnodes " +
          std::to_string(n) + " and the same --master_addr/--master_port (" + e.what() + ")");
    }
    if (Clock::now() < deadline) {
      spdlog::info("rendezvous {} round {}: {}/{} nodes joined, waiting for the others at {}",
                   options_.run_id, r, joined, n, store_->endpoint());
      continue;
    }
    std::string missing;
    for (int i = 0; i < n; ++i) {
      if (!store_->check({round_key(r, "lws/" + std::to_string(i))})) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      }
    }
    throw RendezvousTimeoutError(
        "rendezvous '" + options_.run_id + "' round " + std::to_string(r) + ": only " +
        std::to_string(joined) + " of " + std::to_string(n) + " nodes joined within " +
        std::to_string(options_.join_timeout.count() / 1000) + " s at " + store_->endpoint() +
        "; missing node ranks: " + missing + ". Start ddprun on every node with --nnodes " +
        std::to_string(n) + " and the same --master_addr/--master_port");
  }
  std::vector<std::string> lws_keys;
  for (int i = 0; i < n; ++i) lws_keys.push_back(round_key(r, "lws/" + std::to_string(i)));
  RendezvousInfo info;
  info.round = r;
  info.group_rank = options_.node_rank;
  info.group_world_size = n;
  info.store_host = options_.master_addr;
  info.store_port = port_;
  // Global ranks: node ranks in order, base = the sum of the local world sizes of lower nodes.
  auto sizes = store_->multi_get(lws_keys);
  info.world_size = 0;
  for (int i = 0; i < n; ++i) {
    int lws = std::stoi(sizes[static_cast<size_t>(i)]);
    if (i < options_.node_rank) info.base_rank += lws;
    info.world_size += lws;
  }
  round_ = r;
  return info;
}

RoundStop StaticRendezvous::stop_round(const RoundStop& stop) { return keys_.stop(*store_, round_.load(), stop); }

std::optional<RoundStop> StaticRendezvous::wait_round_stopped(milliseconds timeout) {
  return keys_.wait_stopped(*watcher_, round_.load(), timeout);
}

void StaticRendezvous::node_done() { keys_.done(*store_, round_.load(), options_.nnodes, options_.node_rank); }

void StaticRendezvous::set_closed() { keys_.set_closed(*store_); }

bool StaticRendezvous::is_closed() { return keys_.is_closed(*store_); }

void StaticRendezvous::shutdown() {
  keys_.leave(*store_, round_.load(), options_.nnodes, server_ != nullptr);
  store_->close();
  watcher_->close();
  if (server_) server_->stop();
}

}  // namespace ddprun::rdzv
