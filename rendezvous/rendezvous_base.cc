#include "rendezvous/rendezvous_base.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

RendezvousBase::RendezvousBase(std::string run_id, std::shared_ptr<const StoreAuth> auth)
    : keys_(std::move(run_id)), auth_(std::move(auth)) {}

RendezvousBase::~RendezvousBase() = default;

uint16_t RendezvousBase::host_store(const StoreServerOptions& options) {
  StoreServerOptions with_auth = options;
  with_auth.auth = auth_;
  server_ = std::make_unique<StoreServerThread>(with_auth);  // BindError names addr:port
  spdlog::info("rendezvous {}: hosting the store on {}", run_id(), server_->local_endpoint());
  return server_->port();
}

void RendezvousBase::connect(const std::string& host, uint16_t port, const Timeouts& t) {
  endpoint_ = format_endpoint(host, port);
  {
    std::lock_guard lock(access_mu_);
    access_host_ = host;
    port_ = port;
  }
  StoreClientOptions co;
  co.connect_timeout = t.connect;
  co.timeout = t.request;
  co.auth = auth_;
  try {
    auto store = std::make_unique<StoreClient>(host, port, co);
    if (t.reconnect.count() > 0) store->set_connect_timeout(t.reconnect);
    // The watcher's requests, and its reconnections, are short: a stalled store shows at once, and
    // StoreSilence decides whether it is tolerated yet.
    co.connect_timeout = t.watcher_request;
    co.timeout = t.watcher_request;
    auto watcher = std::make_unique<StoreClient>(host, port, co);
    if (t.watcher_reconnect.count() > 0) watcher->set_connect_timeout(t.watcher_reconnect);
    store_ = std::move(store);
    watcher_ = std::move(watcher);
  } catch (const StoreError& e) {
    throw store_failure(e);
  }
  silence_ = StoreSilence("rendezvous '" + run_id() + "': ", endpoint_, t.stall_tolerance);
}

void RendezvousBase::attach(std::unique_ptr<Store> store, std::unique_ptr<Store> watcher,
                            std::string endpoint, const Timeouts& t) {
  endpoint_ = std::move(endpoint);
  {
    std::lock_guard lock(access_mu_);
    access_host_.clear();  // not a ddprun store: nothing for observers
  }
  store_ = std::move(store);
  watcher_ = std::move(watcher);
  silence_ = StoreSilence("rendezvous '" + run_id() + "': ", endpoint_, t.stall_tolerance);
}

void RendezvousBase::enter_round(int round, int rank, int nodes) {
  rank_ = rank;
  nodes_ = nodes;
  round_ = round;
}

std::optional<RoundStop> RendezvousBase::watch_step(Clock::time_point deadline) {
  // Rounded up: a wait rounded down ends just before the deadline, and the caller's loop would then send a
  // 0 ms WAIT (and its CANCEL_WAIT) again and again until the deadline passed.
  auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
  return keys_.wait_stopped(*watcher_, round_.load(), std::max(milliseconds(0), left));
}

std::optional<RoundStop> RendezvousBase::do_wait_round_stopped(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto started = Clock::now();
    try {
      auto stop = watch_step(deadline);
      silence_.answered();
      if (stop || Clock::now() >= deadline) return stop;
    } catch (const StoreError& e) {
      // A stall or a lost connection may pass; a reply that makes no sense, or a closed client, will not.
      if (!StoreSilence::silent_or_gone(e)) throw;
      if (store_gone()) {
        throw RendezvousStoreError("rendezvous '" + run_id() + "': nothing listens at " + endpoint_ +
                                   " any more; last error: " + e.what());
      }
      silence_.failed(e, started);  // RendezvousStoreError once the store was silent past the tolerance
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(
          std::min(milliseconds(100), duration_cast<milliseconds>(deadline - Clock::now())));
    }
  }
}

std::optional<int64_t> RendezvousBase::wait_or_count(const std::string& key, const std::string& count,
                                                     Clock::time_point deadline, milliseconds slice) {
  auto left = duration_cast<milliseconds>(deadline - Clock::now());
  try {
    store_->wait({key}, std::clamp(left, milliseconds(1), slice));
    return std::nullopt;
  } catch (const WaitTimeoutError&) {  // not yet (a store that does not answer is a TimeoutError)
  }
  return store_->add(count, 0);
}

RendezvousClosedError RendezvousBase::closed_error() const {
  return RendezvousClosedError("rendezvous '" + run_id() + "' at " + endpoint_ +
                               " is closed: the job already finished; start a new job with a new --rdzv_id");
}

RendezvousStoreError RendezvousBase::unreadable(const std::string& what, const std::string& text) const {
  return RendezvousStoreError("rendezvous '" + run_id() + "': the store at " + endpoint_ +
                              " holds an unreadable " + what + " '" + text +
                              "'; does another program use --rdzv_id " + run_id() + " on this store?");
}

int RendezvousBase::read_int(const std::string& text, const std::string& what, int min) const {
  auto v = parse_int(text);
  if (!v || *v < min || *v > INT_MAX) throw unreadable(what, text);
  return static_cast<int>(*v);
}

RoundStop RendezvousBase::do_stop_round(const RoundStop& stop) {
  return keys_.stop(*store_, round_.load(), stop);
}

void RendezvousBase::do_node_done() {
  keys_.done(*store_, round_.load(), nodes_, rank_);
}

void RendezvousBase::do_set_closed() {
  keys_.set_closed(*store_);
}

bool RendezvousBase::do_is_closed() {
  return keys_.is_closed(*store_);
}

void RendezvousBase::do_shutdown() {
  keys_.leave(*store_, round_.load(), nodes_, server_ != nullptr);
  store_->close();
  watcher_->close();
  if (server_) server_->stop();
}

std::optional<StoreServerStats> RendezvousBase::hosted_store_stats() {
  if (!server_) return std::nullopt;
  return server_->stats();
}

std::optional<StoreAccess> RendezvousBase::observer_store() const {
  std::lock_guard lock(access_mu_);
  if (access_host_.empty()) return std::nullopt;  // no ddprun store (attach), or not connected yet
  return StoreAccess{
      .host = access_host_, .port = port_, .auth = auth_, .run_id = run_id(), .identity = identity()};
}

std::string RendezvousBase::identity() const {
  static const std::string mine = local_hostname() + ":" + std::to_string(::getpid());
  return mine;
}

RendezvousStoreError RendezvousBase::store_failure(const StoreError& e) const {
  std::string text = e.what();
  if (text.find(endpoint_) == std::string::npos) text = "the store at " + endpoint_ + ": " + text;
  return RendezvousStoreError("rendezvous '" + run_id() + "': " + text);
}

}  // namespace ddprun::rdzv
