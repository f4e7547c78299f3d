#include "rendezvous/store/store_server.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_server_impl.h"

namespace ddprun::rdzv {

namespace {

std::string describe(const tcp::endpoint& ep) {
  return format_endpoint(ep.address().to_string(), ep.port());
}

// The peer's address alone, an IPv4-mapped IPv6 address (a dual-stack listener's IPv4 client) as IPv4.
std::string address_of(const tcp::endpoint& ep) {
  const auto a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6()).to_string();
  }
  return a.to_string();
}

// Every address of this host's interfaces, and the loopback ones: clients from these are on the store's own
// node.
std::unordered_set<std::string> host_addresses() {
  std::unordered_set<std::string> out{"127.0.0.1", "::1"};
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    char text[INET6_ADDRSTRLEN] = "";
    if (i->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, text, sizeof text);
    }
    if (*text) out.insert(asio::ip::make_address(text).to_string());  // asio's spelling, as address_of's
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

void StoreServer::Impl::bind() {
  const std::string& host = options.host;
  std::vector<tcp::endpoint> candidates;
  if (host.empty() || host == "::" || host == "*") {
    candidates.emplace_back(asio::ip::address_v6::any(), options.port);
    candidates.emplace_back(asio::ip::address_v4::any(), options.port);
  } else {
    boost::system::error_code ec;
    tcp::resolver resolver(io);
    auto results = resolver.resolve(host, std::to_string(options.port),
                                    tcp::resolver::passive | tcp::resolver::address_configured, ec);
    if (ec || results.empty()) {
      throw BindError("cannot listen on " + format_endpoint(host, options.port) + ": cannot resolve '" +
                      host + "' (" + ec.message() + "); give an address of this machine");
    }
    for (const auto& r : results) candidates.push_back(r.endpoint());
  }
  boost::system::error_code last;
  for (const auto& ep : candidates) {
    boost::system::error_code ec;
    acceptor.open(ep.protocol(), ec);
    if (ec) {
      last = ec;
      continue;
    }
    if (ep.address().is_v6() && ep.address().is_unspecified()) {
      acceptor.set_option(asio::ip::v6_only(false), ec);
    }
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(options.backlog, ec);
    if (!ec) return;
    last = ec;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    if (ec == asio::error::address_in_use) break;  // the same port on the fallback would fail too
  }
  std::string hint = last == asio::error::address_in_use
                         ? "another process (a store, ddprun or torchrun) holds the port"
                         : "check that the address belongs to this machine";
  throw BindError("cannot listen on " + format_endpoint(host.empty() ? "::" : host, options.port) + ": " +
                  last.message() + "; " + hint);
}

void StoreServer::Impl::note_refusal(const std::string& address, const std::string& peer,
                                     const std::string& why) {
  uint64_t unlogged = 0;
  if (!refusal_log.should_log(address, std::chrono::steady_clock::now(), unlogged)) return;
  spdlog::warn("store: refused client {}: {} (logged once a minute per address{})", peer, why,
               unlogged ? "; " + std::to_string(unlogged) + " refusals not logged since the last line" : "");
}

void StoreServer::Impl::refuse(tcp::socket socket) {
  ++counters.refused;
  ++refusals_since_log;
  auto now = std::chrono::steady_clock::now();
  if (now - last_refusal_log > std::chrono::seconds(1)) {
    spdlog::warn("store: refused {} connection(s): {} connections open, the limit is {}", refusals_since_log,
                 connections.size(), options.max_connections);
    last_refusal_log = now;
    refusals_since_log = 0;
  }
  boost::system::error_code ignored;
  socket.close(ignored);
}

// Out of file descriptors or similar: say so (once a second with a count), back off briefly, keep serving
// the existing clients.
void StoreServer::Impl::accept_failed(const boost::system::error_code& ec) {
  ++accept_errors_since_log;
  auto now = std::chrono::steady_clock::now();
  if (now - last_accept_error_log > std::chrono::seconds(1)) {
    spdlog::error("store: accept failed {} time(s): {}; {} connections open; retrying every 100 ms",
                  accept_errors_since_log, ec.message(), connections.size());
    last_accept_error_log = now;
    accept_errors_since_log = 0;
  }
  reclaim_silent();
  retry_timer.expires_after(std::chrono::milliseconds(100));
  retry_timer.async_wait([keep = self.lock(), this](const boost::system::error_code& tec) {
    if (!tec && !stopped) accept();
  });
}

std::vector<std::pair<size_t, std::shared_ptr<StoreServer::Connection>>> StoreServer::Impl::holdings() const {
  // One walk over each connection's buffers: holders counts them, `buffers` keeps them for the shares.
  std::unordered_map<const std::string*, size_t> holders;  // shared buffer -> connections referencing it
  std::vector<std::vector<const std::string*>> buffers;    // per connection, in the order of `connections`
  buffers.reserve(connections.size());
  for (const auto& c : connections) {
    auto& mine = buffers.emplace_back();
    c->for_each_shared([&](const std::string& b) {
      mine.push_back(&b);
      ++holders[&b];
    });
  }
  std::vector<std::pair<size_t, std::shared_ptr<Connection>>> ranked;
  ranked.reserve(connections.size());
  size_t i = 0;
  for (const auto& c : connections) {
    size_t held = c->owned();
    for (const std::string* b : buffers[i++]) held += b->size() / holders[b];
    ranked.emplace_back(held, c);
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return ranked;
}

void StoreServer::Impl::enforce_budget() {
  const size_t budget = options.memory_budget;
  const size_t share = budget / std::max<size_t>(1, connections.size());
  // Ranked once per call: a shared buffer leaves the total only when its last holder is dropped, so the
  // holders of one buffer are dropped in turn while the total stays over the budget.
  bool logged = false;
  for (const auto& [held, c] : holdings()) {
    if (buffered() <= budget) return;
    // The connection whose request is being handled is spared: its input is released right after.
    if (c.get() == handling || c->closing()) continue;
    // Only a connection over its share is dropped; what is left over is held by connections being closed.
    if (held <= share) return;
    if (!std::exchange(logged, true)) {
      spdlog::warn("store: {} bytes buffered for clients, over the budget of {}", buffered(), budget);
    }
    c->close_soon("holds " + std::to_string(held) + " bytes of the store's memory (its share is " +
                  std::to_string(share) + ")");  // its queued output is released at once
  }
}

// Near the connection limit, closes connections that were not established for silent_timeout, oldest first.
void StoreServer::Impl::reclaim_silent() {
  if (connections.size() * 10 < options.max_connections * 9) return;
  const auto cutoff = std::chrono::steady_clock::now() - options.silent_timeout;
  while (!silent.empty() && connections.size() * 10 >= options.max_connections * 9) {
    auto c = silent.front().lock();
    if (c && c->silent() && !c->closing() && c->accepted_at() > cutoff) return;  // the oldest is young
    silent.pop_front();
    if (c && c->silent() && !c->closing()) {
      c->close("not established for " + std::to_string(options.silent_timeout.count()) +
               " ms (nothing but VALIDATE, PING or AUTH) while the store is near its connection limit");
    }
  }
}

bool StoreServer::Impl::evict_for_newcomer() {
  while (!strangers.empty()) {
    auto c = strangers.front().lock();
    strangers.pop_front();
    if (!c || !c->silent() || c->closing() || admitted(c->address())) continue;
    c->drop_handshake("closed to make room for a new connection at the limit of " +
                      std::to_string(options.max_connections) + ": it had not authenticated");
    return true;
  }
  const auto cutoff = std::chrono::steady_clock::now() - options.handshake_timeout;
  while (!handshake_only.empty()) {
    auto c = handshake_only.front().lock();
    if (c && c->silent() && !c->closing() && c->spoke_at() > cutoff) return false;  // the oldest is young
    handshake_only.pop_front();
    if (!c || !c->silent() || c->closing()) continue;
    c->drop_handshake("closed to make room for a new connection at the limit of " +
                      std::to_string(options.max_connections) + ": for " +
                      std::to_string(options.handshake_timeout.count()) +
                      " ms it had sent nothing but VALIDATE, PING or AUTH");
    return true;
  }
  return false;
}

void StoreServer::Impl::accept() {
  acceptor.async_accept([keep = self.lock(), this](const boost::system::error_code& ec, tcp::socket socket) {
    if (stopped) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) accept_failed(ec);
      return;
    }
    reclaim_silent();
    boost::system::error_code pec;
    auto remote = socket.remote_endpoint(pec);
    std::string address = pec ? std::string() : address_of(remote);
    const bool stranger = options.auth && !admitted(address);
    const auto waiting = stranger ? handshaking.find(source_of(address)) : handshaking.end();
    if (waiting != handshaking.end() && waiting->second >= options.max_handshakes_per_address) {
      ++counters.handshakes_dropped;
      note_refusal(address, pec ? std::string("unknown peer") : describe(remote),
                   "more than " + std::to_string(options.max_handshakes_per_address) +
                       " connections from its address have not authenticated");
      boost::system::error_code ignored;
      socket.close(ignored);
    } else if (connections.size() >= options.max_connections && !evict_for_newcomer()) {
      refuse(std::move(socket));
    } else {
      std::string peer = pec ? std::string("unknown peer") : describe(remote);
      ++counters.accepted;
      auto conn = std::make_shared<Connection>(keep, std::move(socket), std::move(peer), std::move(address),
                                               stranger);
      connections.insert(conn);
      silent.push_back(conn);
      if (stranger) strangers.push_back(conn);
      auto expired = [](const auto& w) {
        auto c = w.lock();
        return !c || !c->silent();
      };
      if (silent.size() > 2 * connections.size() + 64) std::erase_if(silent, expired);  // now and then
      if (strangers.size() > 2 * connections.size() + 64) std::erase_if(strangers, expired);
      if (handshake_only.size() > 2 * connections.size() + 64) std::erase_if(handshake_only, expired);
      conn->start();
    }
    accept();
  });
}

namespace {

// max_connections 0: the descriptor limit (soft raised to hard) minus a reserve for the rest of the process.
size_t connection_limit(size_t configured) {
  if (configured > 0) return configured;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  const rlim_t reserve = 64;
  return lim.rlim_cur > 2 * reserve ? static_cast<size_t>(lim.rlim_cur - reserve)
                                    : static_cast<size_t>(lim.rlim_cur / 2);
}

}  // namespace

size_t default_memory_budget(const WireLimits& limits) {
  return 4 * limits.max_value_bytes;
}

StoreServer::StoreServer(asio::io_context& io, StoreServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  // An auth that does not require its proof (MUNGE under auto, munged failing: the host's decision) is an
  // open store.
  if (impl_->options.auth && !impl_->options.auth->store_requires()) impl_->options.auth.reset();
  impl_->options.max_connections = connection_limit(impl_->options.max_connections);
  if (impl_->options.memory_budget == 0) {
    impl_->options.memory_budget = default_memory_budget(impl_->options.limits);
  }
  impl_->self = impl_;
  for (const auto& [key, value] : impl_->options.preset) impl_->state.set(key, value);
  if (impl_->options.on_connection_key_released) {
    impl_->state.set_release_hook(impl_->options.on_connection_key_released);
  }
  if (impl_->options.auth) impl_->own_addresses = host_addresses();
  impl_->bind();
  impl_->accept();
}

StoreServer::~StoreServer() {
  stop();
}

uint16_t StoreServer::port() const {
  boost::system::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

std::string StoreServer::local_endpoint() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? std::string("(closed)") : describe(ep);
}

void StoreServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->retry_timer.cancel();
  impl_->auth_workers.stop();             // no step runs, nor gives an outcome back, after this
  auto connections = impl_->connections;  // close() erases from the set
  for (auto& c : connections) c->close("");
}

StoreServerStats StoreServer::stats() const {
  StoreServerStats s = impl_->counters;
  s.connections = impl_->connections.size();
  s.keys = impl_->state.num_keys();
  s.pending_waits = impl_->state.pending_waits();
  s.stored_bytes = impl_->state.stored_bytes();
  s.buffered_bytes = impl_->buffered();
  s.shared_bytes = impl_->shared.bytes();
  s.peak_buffered_bytes = impl_->peak_buffered;
  s.memory_budget = impl_->options.memory_budget;
  return s;
}

}  // namespace ddprun::rdzv
