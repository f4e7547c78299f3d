// DynamicRendezvous (rendezvous/c10d/dynamic_rendezvous.h): what its store failover adds — finding the job's
// store among several endpoints, the standby store, noticing the store's loss, moving to the successor that
// takes over (rendezvous/c10d/store_failover.h), and a store host learning that its job moved on without it.
#include <spdlog/spdlog.h>

#include <thread>

#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/reachability.h"
#include "rendezvous/util/duration_text.h"

namespace ddprun::rdzv {

using std::chrono::milliseconds;

void DynamicRendezvous::connect_to_job() {
  if (options_.fallback_endpoints.empty() || hosts_store()) {
    connect(store_at_.host, store_at_.port, timeouts());
    return;
  }
  std::vector<Endpoint> endpoints{store_at_};
  endpoints.insert(endpoints.end(), options_.fallback_endpoints.begin(), options_.fallback_endpoints.end());
  std::string names;
  for (const auto& ep : endpoints) names += (names.empty() ? "" : ", ") + ep.to_string();
  const auto deadline = Clock::now() + options_.join_timeout;
  auto next_log = Clock::now();
  while (true) {
    if (auto found = failover_.find_job(endpoints)) {
      store_at_ = *found;
      connect(store_at_.host, store_at_.port, timeouts());
      return;
    }
    if (Clock::now() >= deadline) {
      throw RendezvousStoreError("rendezvous '" + run_id() + "': none of the endpoints " + names +
                                 " served the job within " + duration_text(options_.join_timeout) +
                                 " (join_timeout). Check --rdzv_endpoint and that the first node runs");
    }
    if (Clock::now() >= next_log) {
      spdlog::info("rendezvous {}: waiting for one of {} to serve the job", run_id(), names);
      next_log = Clock::now() + options_.progress_interval;
    }
    std::this_thread::sleep_for(milliseconds(500));
  }
}

void DynamicRendezvous::start_standby() {
  std::string address = options_.local_addr;
  if (address.empty()) address = source_address_towards(store_at_.host, store_at_.port);
  if (address.empty()) address = options_.host;
  // The port of this host's entry in the endpoint list (so that a later node's list finds it; taken: no
  // standby, never another port), else a free one: a standby must not take a well-known port that another
  // job on this host may want for its store.
  uint16_t port = 0;
  for (const auto& ep : options_.fallback_endpoints) {
    if (is_local_host(ep.host)) port = ep.port;
  }
  // The standby may become the job's store: it reports a lost agent at once, as the first store's host does.
  standby_reporter_ = std::make_unique<LossReporter>(keys_, auth_);
  failover_.start_standby(address, port, options_.store_memory_budget, options_.local_addr,
                          standby_reporter_->hook());
  if (failover_.standby_port() == 0) {  // its listed port is taken: no standby (StoreFailover said why)
    standby_reporter_.reset();
    return;
  }
  standby_reporter_->start(options_.local_addr.empty() ? "127.0.0.1" : options_.local_addr,
                           failover_.standby_port());
}

RoundStop DynamicRendezvous::lose_store(const std::string& why) {
  store_lost_ = true;
  std::string reason = why;
  if (const std::string context = "rendezvous '" + run_id() + "': "; reason.starts_with(context)) {
    reason.erase(0, context.size());
  }
  const std::string detail = "the store at " + endpoint() + " is lost";
  if (done_round_ == round_.load()) {
    // This node's workers all succeeded (it waits in the exit barrier): as torchrun's exit barrier, a store
    // gone after success is not a failure, and there is nothing to move.
    spdlog::warn("rendezvous {}: {} ({}) after this node's workers succeeded", run_id(), detail, reason);
    return RoundStop{RoundStop::Kind::kDone, -1, detail + " after this node's workers succeeded", 0};
  }
  spdlog::warn("rendezvous {}: {} ({}); moving the job to the round's first live successor", run_id(), detail,
               reason);
  return RoundStop{RoundStop::Kind::kMembership, -1, detail, 0};
}

void DynamicRendezvous::do_node_done() {
  done_round_ = round_.load();
  RendezvousBase::do_node_done();
}

void DynamicRendezvous::fail_over() {
  const std::string lost = endpoint();
  // A successor that was the lost store itself (a failover in a row) is no candidate any more.
  for (size_t i = 0; i < successors_.size(); ++i) {
    if (successors_[i].to_string() == lost)
      successors_.erase(successors_.begin(), successors_.begin() + i + 1);
  }
  auto found = failover_.take_over(successors_, lost);
  if (found.server) server_ = std::move(found.server);
  store_at_ = found.endpoint;
  connect(store_at_.host, store_at_.port, timeouts());
  expected_nodes_ = std::max(0, nodes_ - without_standby_ - found.skipped);
  successors_.erase(successors_.begin(), successors_.begin() + found.skipped + 1);
  store_lost_ = false;
}

std::optional<RoundStop> DynamicRendezvous::moved() const {
  std::lock_guard lock(moved_mu_);
  return moved_;
}

std::optional<RoundStop> DynamicRendezvous::job_moved() {
  if (auto stop = moved()) return stop;
  if (!failover_on() || !hosts_store()) return std::nullopt;
  auto to = failover_.moved_to(successors_, endpoint());
  if (!to) return std::nullopt;
  RoundStop stop{
      RoundStop::Kind::kShutdown, -1,
      "the job moved to the store at " + to->to_string() +
          " while this node, its store host, was unreachable for longer than the heartbeat timeout; "
          "this node leaves the job",
      kJobMovedExitCode};
  spdlog::error("rendezvous {}: {}", run_id(), stop.detail);
  std::lock_guard lock(moved_mu_);
  if (!moved_) moved_ = stop;
  return moved_;
}

std::optional<RoundStop> DynamicRendezvous::do_wait_round_stopped(milliseconds timeout) {
  if (!failover_on()) return RendezvousBase::do_wait_round_stopped(timeout);
  try {
    auto stop = RendezvousBase::do_wait_round_stopped(timeout);
    // A store host thawed after a long freeze: its loss reporter ends the round as the other agents'
    // connections, closed while it was frozen, are read — but those agents may have gone on at a
    // successor's store. Asked only after a stall: the successors' probes cost time on a real node loss.
    if (stop && stop->kind == RoundStop::Kind::kMembership && hosts_store() && stalled_) {
      if (auto moved_stop = job_moved()) return moved_stop;
    }
    return stop;
  } catch (const RendezvousStoreError& e) {  // gone, or silent past the heartbeat timeout
    return lose_store(e.what());
  }
}

RoundStop DynamicRendezvous::do_stop_round(const RoundStop& stop) {
  if (auto moved_stop = moved()) return *moved_stop;  // not this store's round any more: nobody reads it
  while (true) {
    const auto started = Clock::now();
    try {
      return RendezvousBase::do_stop_round(stop);
    } catch (const StoreError& e) {
      if (!failover_on() || !StoreSilence::silent_or_gone(e)) throw;
      if (failover_.lost(store_at_, started)) return lose_store(e.what());
    }
  }
}

bool DynamicRendezvous::store_gone() {
  return failover_on() && probe_tcp(store_at_.host, store_at_.port, milliseconds(1000)) == Reach::kRefused;
}

void DynamicRendezvous::do_shutdown() {
  if (!moved() && !store_lost_) return RendezvousBase::do_shutdown();
  // Nobody is left to wait for: the job went on elsewhere.
  store_->close();
  watcher_->close();
  if (server_) server_->stop();
}

}  // namespace ddprun::rdzv
