#include "rendezvous/c10d/dynamic_rendezvous.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "rendezvous/c10d/c10d_round.h"
#include "rendezvous/reachability.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

DynamicRendezvous::DynamicRendezvous(DynamicRendezvousOptions options)
    : RendezvousBase(options.run_id, options.auth),
      options_(std::move(options)),
      store_at_{options_.endpoint_host, options_.endpoint_port},
      failover_(keys_, heartbeat_timeout(), options_.close_timeout, options_.auth) {
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
      so.host = options_.local_addr;  // "" = every interface
      so.port = options_.endpoint_port;
      so.memory_budget = options_.store_memory_budget;
      loss_reporter_ = std::make_unique<LossReporter>(keys_, auth_);
      so.on_connection_key_released = loss_reporter_->hook();
      store_at_.port = host_store(so);
      loss_reporter_->start(store_at_.host, store_at_.port);
    } catch (const BindError& e) {
      loss_reporter_.reset();
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
  // With MIN = MAX a node that never ran a round has caused no failure (and a first round stays cheap).
  if (options_.min_nodes == options_.max_nodes && round_.load() < 0) return;
  int64_t failures = store_->add(key("failures/" + options_.identity), 0);
  if (failures < 2) return;
  // With MIN = MAX only a spare can take this node's place; without one, sitting out would stop the job.
  if (options_.min_nodes == options_.max_nodes && !spare_waiting()) return;
  step_aside();
  auto cooldown = options_.cooldown_base * (int64_t{1} << std::min<int64_t>(failures - 2, 20));
  cooldown = std::min(cooldown, options_.cooldown_max);
  spdlog::warn(
      "rendezvous {}: the workers of agent {} caused {} failures; keeping this node out for {} (the "
      "cooldown doubles with each further failure)",
      run_id(), options_.identity, failures, duration_text(cooldown));
  std::this_thread::sleep_for(cooldown);
}

// The next round's closer must not wait for this node (it is alive, but sits out): join() announces it again
// afterwards.
void DynamicRendezvous::step_aside() {
  if (const int r = round_.load(); r >= 0 && rank_ >= 0) {
    const std::string rank = std::to_string(rank_);
    store_->multi_set({round_key(r, "aside/" + rank), round_key(r, "lost/" + rank)}, {"1", "1"});
  }
  if (!external()) store_->delete_key(key("live/" + options_.identity));
}

void DynamicRendezvous::do_stand_aside(const std::string& reason) {
  step_aside();
  store_->set(key("unhealthy/" + options_.identity), reason);
  unhealthy_ = true;
}

void DynamicRendezvous::do_note_local_failure() {
  store_->add(key("failures/" + options_.identity), 1);
}

RendezvousInfo DynamicRendezvous::do_next_rendezvous(int local_world_size) {
  if (stalled_ && hosts_store()) job_moved();  // a round stopped by a worker's failure after the thaw
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
  if (unhealthy_) {
    store_->delete_key(key("unhealthy/" + options_.identity));
    unhealthy_ = false;
  }
  announce_alive();
  const auto deadline = Clock::now() + options_.join_timeout;
  int r = std::max(round_.load() + 1, current_round());
  for (bool first = true;; first = false, ++r) {
    if (!first && do_is_closed()) throw closed_error();
    const int64_t index = join_round(r, local_world_size);
    const int64_t arrivals = wait_closed_or_close(r, index);
    if (index >= arrivals) {
      after_close(r, static_cast<int>(std::min<int64_t>(arrivals, options_.max_nodes)), deadline);
    } else if (auto info = await_assignment(r, index, deadline)) {
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
  // MAX arrived (ends a first round's last call), or after a failover every node expected to survive.
  const bool all_expected = expected_nodes_ >= options_.min_nodes && index + 1 == expected_nodes_;
  if (index + 1 == options_.max_nodes || all_expected) store_->set(round_key(r, "full"), "1");
  return index;
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
  spdlog::info(
      "rendezvous {}: round {} runs with {} nodes (the most --nnodes allows): this node waits as a hot spare "
      "and "
      "takes the place of a node that is lost or fails. (If this agent was meant to start a new job, a job "
      "with "
      "--rdzv_id {} is already running at {}: give the new one its own --rdzv_id.)",
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
  auto job_over = [&](const std::string& how) {
    return SpareNotNeededError("rendezvous '" + run_id() + "' at " + endpoint() +
                               ": the job finished (round " + std::to_string(r) + " " + how +
                               ") while this node waited as a hot spare; nothing is left to do. (If this "
                               "agent belongs to a new job, that job reuses the --rdzv_id and endpoint of a "
                               "running one: give it a new --rdzv_id.)");
  };
  try {
    store_->wait({round_key(r, "stop")},
                 std::max(milliseconds(1), duration_cast<milliseconds>(deadline - Clock::now())));
  } catch (const WaitTimeoutError&) {
    throw RendezvousTimeoutError("rendezvous '" + run_id() + "': round " + std::to_string(r) +
                                 " stayed full (" + std::to_string(count) + " nodes = max) for " +
                                 duration_text(options_.join_timeout) + " at " + endpoint());
  } catch (const ConnectionLostError& e) {
    throw reused("ended (the store went away: " + std::string(e.what()) + ")");
  }
  RoundStop stop;
  try {
    stop = keys_.stopped(*store_, r);
  } catch (const ConnectionLostError&) {
    // The round stopped (the WAIT answered) and the store closed before its stop could be read: the agent
    // hosting it left at once, as it does when the job is over (a round that re-forms keeps its store).
    throw job_over("stopped, then its store closed");
  }
  if (stop.kind == RoundStop::Kind::kDone) throw job_over("done");
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
  // The next round's closer does not wait for it: a frozen agent's connection, and its live key, stay.
  watcher_->set(round_key(r, "lost/" + std::to_string(neighbour)), "1");
  if (!external()) {
    const auto members = members_of(*watcher_, r);
    if (static_cast<size_t>(neighbour) < members.size()) {
      watcher_->delete_key(key("live/" + members[static_cast<size_t>(neighbour)]));
    }
  }
  keys_.stop(*watcher_, r, RoundStop{RoundStop::Kind::kMembership, rank_, detail, 0});
  return std::nullopt;
}

std::optional<RoundStop> DynamicRendezvous::watch_step(Clock::time_point deadline) {
  const auto now = Clock::now();
  const auto stall_limit = heartbeat_timeout() / 2;
  if (watched_ != Clock::time_point{} && now - watched_ > stall_limit) stalled_ = true;
  if (now >= next_beat_) {
    if (auto stop = heartbeat_and_check()) return stop;
    next_beat_ = now + options_.keep_alive_interval;
  }
  const auto until = std::min(deadline, next_beat_);
  auto stop = RendezvousBase::watch_step(until);
  watched_ = Clock::now();
  if (watched_ - std::max(now, until) > stall_limit) stalled_ = true;  // frozen inside the wait
  return stop;
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
