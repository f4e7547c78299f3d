#include "rendezvous/c10d/store_failover.h"

#include <spdlog/spdlog.h>

#include <thread>

#include "rendezvous/reachability.h"
#include "rendezvous/rendezvous_error.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_probe.h"
#include "rendezvous/store_silence.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

using std::chrono::milliseconds;

namespace {

constexpr milliseconds kProbe{1000};

// A connection to `ep` whose handshake and every request wait at most `timeout`, after a TCP probe: a
// refused or silent endpoint costs no connect retries. nullptr when the store does not answer.
std::unique_ptr<StoreClient> open_client(const Endpoint& ep, milliseconds timeout,
                                         const std::shared_ptr<const StoreAuth>& auth) {
  if (probe_tcp(ep.host, ep.port, timeout) != Reach::kOpen) return nullptr;
  return probe_store(ep, probe_options(timeout, timeout, auth));
}

std::string reach_text(Reach r) {
  return r == Reach::kRefused ? "nothing listens there" : "no answer";
}

}  // namespace

StoreFailover::StoreFailover(const RoundKeys& keys, milliseconds heartbeat_timeout,
                             milliseconds takeover_timeout, std::shared_ptr<const StoreAuth> auth)
    : keys_(keys),
      auth_(std::move(auth)),
      heartbeat_timeout_(heartbeat_timeout),
      takeover_timeout_(takeover_timeout) {}

StoreFailover::~StoreFailover() = default;

void StoreFailover::start_standby(const std::string& address, uint16_t port, size_t memory_budget,
                                  const std::string& bind_host,
                                  std::function<void(const std::string&)> on_key_released) {
  StoreServerOptions o;
  o.on_connection_key_released = std::move(on_key_released);
  o.host = bind_host;
  standby_bind_ = bind_host;
  o.preset = {{wire_key("standby"), "1"}};
  o.auth = auth_;
  o.port = port;
  o.memory_budget = memory_budget;
  try {
    standby_server_ = std::make_unique<StoreServerThread>(o);
  } catch (const BindError& e) {
    if (port == 0) throw;
    // Never another port: later nodes and the successors' survivors look for this node's standby on its
    // listed port, and whoever holds that port (another agent of this host, or a stranger on a shared host)
    // would stand in for it (docs/security.md, "What is not protected").
    spdlog::error(
        "rendezvous {}: this node keeps no standby store: {}; its listed port {} must be free for "
        "it (a standby never moves to another port, where the job would not look for it). The "
        "job goes on; this node cannot take the store over",
        keys_.run_id(), e.what(), port);
    return;
  }
  standby_ = format_endpoint(address, standby_server_->port());
  spdlog::debug("rendezvous {}: standby store on {}", keys_.run_id(), standby_);
}

std::string StoreFailover::encode(const Successors& s) {
  std::string text = std::to_string(s.without_standby) + "|";
  for (size_t i = 0; i < s.endpoints.size(); ++i) text += (i ? "," : "") + s.endpoints[i].to_string();
  return text;
}

std::optional<StoreFailover::Successors> StoreFailover::decode(std::string_view text) {
  const size_t bar = text.find('|');
  if (bar == std::string_view::npos) return std::nullopt;
  auto n = parse_int(text.substr(0, bar));
  if (!n || *n < 0 || *n > 1'000'000) return std::nullopt;
  Successors s{.without_standby = static_cast<int>(*n), .endpoints = {}};
  const std::string_view list = text.substr(bar + 1);
  if (list.empty()) return s;
  for (const auto& item : split(list, ',')) {
    std::string error;
    auto ep = parse_endpoint(item, std::nullopt, error);
    if (!ep) return std::nullopt;
    s.endpoints.push_back(*ep);
  }
  return s;
}

bool StoreFailover::lost(const Endpoint& store, Clock::time_point silent_since) const {
  const auto deadline = silent_since + heartbeat_timeout_;
  while (true) {
    const Reach reach = probe_tcp(store.host, store.port, kProbe);
    if (reach == Reach::kRefused) return true;
    if (reach == Reach::kOpen && probe_store(store, probe_options(kProbe, kProbe, auth_))) return false;
    if (Clock::now() >= deadline) return true;
    std::this_thread::sleep_for(std::min(milliseconds(250), heartbeat_timeout_));
  }
}

StoreFailover::NewStore StoreFailover::take_over(const std::vector<Endpoint>& successors,
                                                 const std::string& lost) {
  std::string tried;
  for (size_t i = 0; i < successors.size(); ++i) {
    const Endpoint& c = successors[i];
    const std::string name = c.to_string();
    if (name == standby_ && standby_server_) {
      StoreClient self(standby_bind_.empty() ? "127.0.0.1" : standby_bind_, standby_server_->port(),
                       probe_options(milliseconds(5000), milliseconds(5000), auth_));
      self.set(keys_.key("active"), lost);
      spdlog::warn("rendezvous {}: the store at {} is lost; this node ({}) hosts the job's store from now on",
                   keys_.run_id(), lost, name);
      standby_.clear();
      return NewStore{.endpoint = c, .server = std::move(standby_server_), .skipped = static_cast<int>(i)};
    }
    std::string why;
    const Reach reach = probe_tcp(c.host, c.port, milliseconds(2000));
    if (reach != Reach::kOpen) {
      why = reach_text(reach);
    } else {
      spdlog::info("rendezvous {}: the store at {} is lost; waiting for {} to take over", keys_.run_id(),
                   lost, name);
      try {
        StoreClient peer(c.host, c.port,
                         probe_options(milliseconds(2000), takeover_timeout_ + milliseconds(5000), auth_));
        peer.wait({keys_.key("active")}, takeover_timeout_);
        spdlog::warn("rendezvous {}: the store at {} is lost; the job moves to {}", keys_.run_id(), lost,
                     name);
        return NewStore{.endpoint = c, .server = nullptr, .skipped = static_cast<int>(i)};
      } catch (const WaitTimeoutError&) {
        why = "did not take over within " + duration_text(takeover_timeout_);
      } catch (const StoreError& e) {
        why = e.what();
      }
    }
    spdlog::warn("rendezvous {}: successor {} cannot host the store ({}); trying the next one",
                 keys_.run_id(), name, why);
    tried += (tried.empty() ? "" : "; ") + name + ": " + why;
  }
  throw RendezvousStoreError("rendezvous '" + keys_.run_id() + "': lost the store at " + lost +
                             (successors.empty()
                                  ? " and no other node of the round can host it (every agent runs "
                                    "with --rdzv_conf failover=0, or the round had one node)"
                                  : " and none of its successors can host it (" + tried + ")"));
}

std::optional<Endpoint> StoreFailover::moved_to(const std::vector<Endpoint>& successors,
                                                const std::string& lost) const {
  for (const Endpoint& c : successors) {
    auto client = open_client(c, kProbe, auth_);
    try {
      if (client && client->check({keys_.key("active")}) && client->get(keys_.key("active")) == lost)
        return c;
    } catch (const StoreError&) {
    }
  }
  return std::nullopt;
}

std::optional<Endpoint> StoreFailover::find_job(const std::vector<Endpoint>& endpoints) const {
  for (const Endpoint& ep : endpoints) {
    auto client = open_client(ep, kProbe, auth_);
    try {
      if (client && (!client->check({keys_.key("standby")}) || client->check({keys_.key("active")})))
        return ep;
    } catch (const StoreError&) {
    }
  }
  return std::nullopt;
}

}  // namespace ddprun::rdzv
