#include "rendezvous/dynamic_rendezvous.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "rendezvous/c10d_round.h"
#include "rendezvous/reachability.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

DynamicRendezvous::DynamicRendezvous(DynamicRendezvousOptions options)
    : RendezvousBase(options.run_id),
      options_(std::move(options)),
      store_at_{options_.endpoint_host, options_.endpoint_port},
      failover_(keys_, heartbeat_timeout(), options_.close_timeout) {
  if (options_.host.empty()) options_.host = local_hostname();
  if (options_.identity.empty()) options_.identity = options_.host + ":" + std::to_string(::getpid());
  if (external()) {
    const Timeouts t = timeouts();
    try {
      attach(options_.external_store(t.request), options_.external_store(t.watcher_request),
             options_.external_name, t);
    } catch (const StoreError& e) {
      throw store_failure(e);
    }
    return;
  }
  bool hosting = options_.is_host.value_or(is_local_host(options_.endpoint_host));
  if (hosting && !options_.is_host && !options_.fallback_endpoints.empty()) {
    // This host was the job's first store host and may come back after the job moved on: join it there.
    if (auto moved = failover_.find_job(options_.fallback_endpoints)) {
      spdlog::info("rendezvous {}: the job runs at {}; joining it there", run_id(), moved->to_string());
      hosting = false;
    }
  }
  if (hosting) {
    try {
      StoreServerOptions so;
      so.port = options_.endpoint_port;
      so.memory_budget = options_.store_memory_budget;
      store_at_.port = host_store(so);
    } catch (const BindError& e) {
      if (options_.is_host.value_or(false)) throw;
      spdlog::info("rendezvous {}: {} is in use on this host; joining the agent that hosts it", run_id(),
                   store_at_.to_string());
    }
  }
  connect_to_job();
  if (failover_on() && !hosts_store()) start_standby();
}

DynamicRendezvous::~DynamicRendezvous() = default;

RendezvousBase::Timeouts DynamicRendezvous::timeouts() const {
  // With failover, a store silent for the heartbeat timeout is lost (as a node would be): no request waits
  // longer, and the watcher tolerates no longer stall.
  const auto tolerance =
      failover_on() ? std::min(options_.read_timeout, heartbeat_timeout()) : options_.read_timeout;
  return Timeouts{.connect = options_.join_timeout,
                  .request = tolerance,
                  .watcher_request = options_.keep_alive_interval,
                  .stall_tolerance = tolerance,
                  .reconnect = failover_on() ? heartbeat_timeout() : milliseconds(0),
                  .watcher_reconnect = failover_on()
                                           ? std::min(options_.keep_alive_interval, milliseconds(250))
                                           : milliseconds(0)};
}

int DynamicRendezvous::current_round() {
  if (!store_->check({key("round")})) return 0;
  return read_int(store_->get(key("round")), "round number", 0);
}

void DynamicRendezvous::sit_out_if_failing() {
  if (options_.min_nodes == options_.max_nodes) return;  // nobody could replace this node
  int64_t failures = store_->add(key("failures/" + options_.identity), 0);
  if (failures < 2) return;
  auto cooldown = options_.cooldown_base * (int64_t{1} << std::min<int64_t>(failures - 2, 20));
  cooldown = std::min(cooldown, options_.cooldown_max);
  spdlog::warn(
      "rendezvous {}: the workers of agent {} caused {} failures; keeping this node out for {} (the "
      "cooldown doubles with each further failure)",
      run_id(), options_.identity, failures, duration_text(cooldown));
  std::this_thread::sleep_for(cooldown);
}

void DynamicRendezvous::do_note_local_failure() {
  store_->add(key("failures/" + options_.identity), 1);
}

RendezvousInfo DynamicRendezvous::do_next_rendezvous(int local_world_size) {
  if (auto stop = moved()) throw RendezvousClosedError("rendezvous '" + run_id() + "': " + stop->detail);
  while (true) {
    if (store_lost_) fail_over();
    const auto started = Clock::now();
    try {
      return join(local_world_size);
    } catch (const StoreError& e) {
      // The store went away while this node joined: once it ran a round, this node knows who takes over.
      if (!failover_on() || successors_.empty() || !StoreSilence::silent_or_gone(e) ||
          !failover_.lost(store_at_, started))
        throw;
      lose_store(e.what());
    }
  }
}

RendezvousInfo DynamicRendezvous::join(int local_world_size) {
  if (do_is_closed()) throw closed_error();
  sit_out_if_failing();
  const auto deadline = Clock::now() + options_.join_timeout;
  int r = std::max(round_.load() + 1, current_round());
  for (bool first = true;; first = false, ++r) {
    if (!first && do_is_closed()) throw closed_error();
    const int64_t index = join_round(r, local_world_size);
    if (index < options_.max_nodes) wait_closed_or_close(r, index);
    const int count = index < options_.max_nodes ? read_int(store_->get(round_key(r, "closed")),
                                                            "node count of round " + std::to_string(r), 1)
                                                 : options_.max_nodes;
    if (index >= count) {
      after_close(r, count, deadline);
    } else if (auto info = await_assignment(r, index)) {
      return *info;
    }
  }
}

int64_t DynamicRendezvous::join_round(int r, int local_world_size) {
  const int64_t index = store_->add(round_key(r, "joined"), 1) - 1;
  store_->set(round_key(r, "node/" + std::to_string(index)),
              encode(NodeDescriptor{.identity = options_.identity,
                                    .previous_rank = previous_rank_,
                                    .local_world_size = local_world_size,
                                    .standby = failover_.standby()}));
  // After a failover, the round is complete once every node expected to survive joined.
  const bool all_expected = expected_nodes_ >= options_.min_nodes && index + 1 == expected_nodes_;
  if (index + 1 == options_.max_nodes || all_expected) store_->set(round_key(r, "full"), "1");
  return index;
}

void DynamicRendezvous::wait_closed_or_close(int r, int64_t index) {
  if (index + 1 == options_.min_nodes) {
    last_call(r);
    return;
  }
  const auto start = Clock::now();
  const auto deadline = start + options_.join_timeout;
  int64_t k = index + 1;  // nodes known to have joined
  while (true) {
    try {
      auto count =
          wait_or_count(round_key(r, "closed"), round_key(r, "joined"), deadline, options_.progress_interval);
      if (!count) return;
      k = *count;
    } catch (const ConnectionLostError& e) {
      if (failover_on() && !successors_.empty()) throw;  // lost after a round: next_rendezvous fails over
      // Only the store host's agent can take the store away before the round completes: it gave up waiting
      // (its join timeout, usually a little ahead of ours) or was stopped. Report the timeout, not the
      // socket.
      throw RendezvousTimeoutError(
          "rendezvous '" + run_id() + "' round " + std::to_string(r) + ": the store at " + endpoint() +
          " went away while this node waited for at least " + std::to_string(options_.min_nodes) +
          " nodes (" + std::to_string(k) +
          " had joined): the agent hosting it gave up, most likely at its join timeout (" +
          duration_text(options_.join_timeout) +
          " here). Start every node within join_timeout of the first, with the same --rdzv_endpoint and "
          "--rdzv_id, or lower --nnodes MIN (" +
          e.what() + ")");
    }
    if (Clock::now() >= deadline) throw too_few_nodes(r, k);
    if (k >= options_.min_nodes &&
        Clock::now() - start > options_.last_call_timeout + options_.close_timeout) {
      spdlog::warn("rendezvous {} round {}: the node running the last call vanished; closing the round",
                   run_id(), r);
      close_round(r, k);
      continue;
    }
    spdlog::info("rendezvous {} round {}: {}/{} joined (max {}), waiting for {} at {}", run_id(), r, k,
                 options_.min_nodes, options_.max_nodes,
                 k < options_.min_nodes ? "more nodes" : "the last call to end", endpoint());
  }
}

void DynamicRendezvous::last_call(int r) {
  const int min = options_.min_nodes, max = options_.max_nodes;
  if (max > min) {
    spdlog::info("rendezvous {} round {}: {} nodes joined (min {}), last call for up to {} more for {}",
                 run_id(), r, min, min, max - min, duration_text(options_.last_call_timeout));
    try {
      store_->wait({round_key(r, "full")}, options_.last_call_timeout);
    } catch (const WaitTimeoutError&) {  // the last call is over
    }
  }
  close_round(r, store_->add(round_key(r, "joined"), 0));
}

void DynamicRendezvous::close_round(int r, int64_t count) {
  count = std::min<int64_t>(count, options_.max_nodes);
  const std::string won = store_->compare_set(round_key(r, "closed"), "", std::to_string(count));
  if (won == std::to_string(count)) assign_ranks(r, count);  // else someone else closed it
}

void DynamicRendezvous::assign_ranks(int r, int64_t count) {
  // This node closed the round: it alone reads the descriptors and assigns every node its rank.
  std::vector<std::string> node_keys;
  for (int64_t i = 0; i < count; ++i) node_keys.push_back(round_key(r, "node/" + std::to_string(i)));
  std::vector<NodeDescriptor> nodes;
  for (const auto& text : store_->multi_get(node_keys)) {
    UnreadableField why;
    auto d = decode_node_descriptor(text, why);
    if (!d) throw unreadable(why.what, why.text);
    nodes.push_back(std::move(*d));
  }
  const std::vector<RankAssignment> assignments = rdzv::assign_ranks(nodes);
  std::vector<std::string> keys, values;
  for (const RankAssignment& a : assignments) {
    keys.push_back(round_key(r, "assign/" + std::to_string(keys.size())));
    values.push_back(encode(a));
  }
  if (!external()) keys_.open_worker_keyspace(*store_, r);
  store_->multi_set(keys, values);
  store_->set(key("round"), std::to_string(r));
  spdlog::info("rendezvous {} round {}: closed with {} nodes ({} workers)", run_id(), r, count,
               assignments.front().world_size);
}

RendezvousTimeoutError DynamicRendezvous::too_few_nodes(int r, int64_t joined) const {
  std::string names;
  const int64_t shown = std::min<int64_t>(joined, 16);
  std::vector<std::string> node_keys;
  for (int64_t i = 0; i < shown; ++i) node_keys.push_back(round_key(r, "node/" + std::to_string(i)));
  for (const auto& d : store_->multi_get(node_keys)) names += (names.empty() ? "" : ", ") + identity_of(d);
  if (joined > shown) names += ", ...";
  return RendezvousTimeoutError(
      "rendezvous '" + run_id() + "' round " + std::to_string(r) + ": only " + std::to_string(joined) +
      " of at least " + std::to_string(options_.min_nodes) + " nodes joined within " +
      duration_text(options_.join_timeout) + " at " + endpoint() + " (joined: " + names +
      "). Start more nodes with the same --rdzv_endpoint and --rdzv_id, or lower "
      "--nnodes MIN");
}

std::optional<RendezvousInfo> DynamicRendezvous::await_assignment(int r, int64_t index) {
  const std::string assign = round_key(r, "assign/" + std::to_string(index));
  try {
    store_->wait({assign}, options_.close_timeout);
  } catch (const WaitTimeoutError&) {
    spdlog::warn("rendezvous {} round {}: no rank assignment within {}; starting a new round", run_id(), r,
                 duration_text(options_.close_timeout));
    keys_.stop(*store_, r, RoundStop{RoundStop::Kind::kMembership, -1, "closer vanished", 0});
    return std::nullopt;
  }
  UnreadableField why;
  auto assignment = decode_rank_assignment(store_->get(assign), why);
  if (!assignment) throw unreadable(why.what, why.text);
  RendezvousInfo info;
  info.round = r;
  info.group_rank = assignment->node_rank;
  info.group_world_size = assignment->nodes;
  info.base_rank = assignment->base_rank;
  info.world_size = assignment->world_size;
  info.store_host = store_at_.host;
  info.store_port = store_at_.port;
  if (external()) share_workers_store(r, info);
  successors_ = std::move(assignment->successors.endpoints);
  without_standby_ = assignment->successors.without_standby;
  expected_nodes_ = 0;
  previous_rank_ = info.group_rank;
  neighbour_beats_ = -1;
  neighbour_seen_ = next_beat_ = Clock::now();
  enter_round(r, info.group_rank, info.group_world_size);
  return info;
}

void DynamicRendezvous::after_close(int r, int count, Clock::time_point deadline) {
  if (count < options_.max_nodes) {
    spdlog::info(
        "rendezvous {}: round {} runs with {} nodes and has room; asking it to re-form with this node",
        run_id(), r, count);
    keys_.stop(*store_, r,
               RoundStop{RoundStop::Kind::kMembership, -1, "node " + options_.identity + " arrived", 0});
    return;
  }
  spdlog::warn(
      "rendezvous {}: round {} is running and full ({} nodes = max); waiting for it to end to join the "
      "next one. If this agent starts a new job, another job with --rdzv_id {} is still running at {}: "
      "give the new job its own --rdzv_id",
      run_id(), r, count, run_id(), endpoint());
  // The job this node waits to join may finish instead of re-forming: then there is no next round, and the
  // agent that hosts the store leaves with it. Either way this agent joined another job's run id.
  auto reused = [&](const std::string& how) {
    return RendezvousConflictError(
        "rendezvous '" + run_id() + "' at " + endpoint() + ": the job running with this --rdzv_id (round " +
        std::to_string(r) + ", " + std::to_string(count) + " nodes = max) " + how +
        " while this agent waited for a place in it. If this agent belongs to a new "
        "job, that job reuses the --rdzv_id and endpoint of a running one: give it a "
        "new --rdzv_id (or another port)");
  };
  std::optional<RoundStop> stop;
  try {
    stop = keys_.wait_stopped(
        *store_, r, std::max(milliseconds(1), duration_cast<milliseconds>(deadline - Clock::now())));
  } catch (const ConnectionLostError& e) {
    throw reused("ended (the store went away: " + std::string(e.what()) + ")");
  }
  if (!stop) {
    throw RendezvousTimeoutError("rendezvous '" + run_id() + "': round " + std::to_string(r) +
                                 " stayed full (" + std::to_string(count) + " nodes = max) for " +
                                 duration_text(options_.join_timeout) + " at " + endpoint());
  }
  if (stop->kind == RoundStop::Kind::kDone) throw reused("finished");
}

std::optional<RoundStop> DynamicRendezvous::heartbeat_and_check() {
  const int r = round_.load();
  if (nodes_ <= 1 || rank_ < 0) return std::nullopt;
  watcher_->add(round_key(r, "hb/" + std::to_string(rank_)), 1);
  // The store answers again after a stall: the neighbour's beats could not be counted meanwhile either.
  if (watcher_answered()) neighbour_seen_ = Clock::now();
  const int neighbour = (rank_ + 1) % nodes_;
  const int64_t beats = watcher_->add(round_key(r, "hb/" + std::to_string(neighbour)), 0);
  const auto now = Clock::now();
  if (beats != neighbour_beats_) {
    neighbour_beats_ = beats;
    neighbour_seen_ = now;
    return std::nullopt;
  }
  const auto silent = duration_cast<milliseconds>(now - neighbour_seen_);
  if (silent <= heartbeat_timeout()) return std::nullopt;
  if (auto stop = job_moved()) return stop;
  const std::string detail =
      "node " + std::to_string(neighbour) + " stopped heartbeating for " + duration_text(silent);
  spdlog::warn("rendezvous {} round {}: {}; re-forming without it", run_id(), r, detail);
  keys_.stop(*watcher_, r, RoundStop{RoundStop::Kind::kMembership, rank_, detail, 0});
  return std::nullopt;
}

std::optional<RoundStop> DynamicRendezvous::watch_step(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (now >= next_beat_) {
    if (auto stop = heartbeat_and_check()) return stop;
    next_beat_ = now + options_.keep_alive_interval;
  }
  return RendezvousBase::watch_step(std::min(deadline, next_beat_));
}

std::vector<int> DynamicRendezvous::do_unresponsive_nodes() {
  const int r = round_.load();
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
  // Every other node silent at once: perhaps this store host was frozen and they moved on (stop_round says
  // so).
  if (!dead.empty()) job_moved();  // stop_round then returns its stop
  return dead;
}

void DynamicRendezvous::share_workers_store(int r, RendezvousInfo& info) {
  const std::string k = round_key(r, "workers_store");
  if (info.group_rank == 0) {
    std::string addr = options_.local_addr;
    if (addr.empty()) addr = source_address_towards(options_.endpoint_host, options_.endpoint_port);
    if (addr.empty()) addr = options_.host;
    store_->set(k, format_endpoint(addr, free_tcp_port(is_local_host(addr) ? addr : "")));
  }
  const std::string text = store_->get(k);
  std::string error;
  auto ep = parse_endpoint(text, std::nullopt, error);
  if (!ep || ep->port == 0) throw unreadable("workers' store address of round " + std::to_string(r), text);
  info.store_host = ep->host;
  info.store_port = ep->port;
  info.agent_store = false;
}

}  // namespace ddprun::rdzv
