#include "rendezvous/store_server.h"

#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <deque>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include "rendezvous/endpoint.h"
#include "rendezvous/key_value_state.h"
#include "rendezvous/reply_queue.h"
#include "rendezvous/store_error.h"
#include "rendezvous/store_session.h"

namespace ddprun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr size_t kScratchBytes = 256 * 1024;
// Stop reading from a client while this much of its output waits behind a write in flight.
constexpr size_t kPauseReadingAt = 4 * 1024 * 1024;

std::string describe(const tcp::endpoint& ep) {
  return format_endpoint(ep.address().to_string(), ep.port());
}

}  // namespace

// Everything the connections share. Lives as long as the longest-lived connection handler.
class StoreServer::Impl {
 public:
  Impl(asio::io_context& io, StoreServerOptions options)
      : io(io), options(std::move(options)), acceptor(io), retry_timer(io) {}

  asio::io_context& io;
  StoreServerOptions options;
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  KeyValueState state;
  SharedBytes shared;  // the stored values that queued replies reference, each counted once
  std::unordered_set<std::shared_ptr<Connection>> connections;
  std::array<uint8_t, kScratchBytes> scratch{};
  StoreServerStats counters;
  bool stopped = false;
  std::weak_ptr<Impl> self;  // set right after construction
  std::chrono::steady_clock::time_point last_refusal_log{};
  uint64_t refusals_since_log = 0;
  std::chrono::steady_clock::time_point last_accept_error_log{};
  uint64_t accept_errors_since_log = 0;
  // Connections that have not sent a byte yet, oldest first (expired entries are skipped).
  std::deque<std::weak_ptr<Connection>> silent;
  // Bytes the connections hold copies of (unfinished requests, copied reply bytes), all connections; with
  // shared.bytes(), what is held for clients (the memory budget's measure).
  size_t owned = 0;
  size_t peak_buffered = 0;
  size_t buffered() const { return owned + shared.bytes(); }
  const Connection* handling = nullptr;  // the connection whose requests are being handled right now

  void bind();
  void accept();
  void accept_failed(const boost::system::error_code& ec);
  void refuse(tcp::socket socket);
  void reclaim_silent();
  // Over memory_budget: drops the connections holding the most until under it again.
  void enforce_budget();
  // Each connection's holding: its own copies, plus its part of every shared buffer it references (a buffer
  // referenced by n connections counts 1/n to each), largest first.
  std::vector<std::pair<size_t, std::shared_ptr<Connection>>> holdings() const;
};

class StoreServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Impl> server, tcp::socket socket, std::string peer)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        peer_(std::move(peer)),
        timer_(server_->io),
        session_(server_->state, server_->options.limits, server_->options.dialect,
                 [this] { on_async_output(); }, &server_->shared),
        writing_(&server_->shared) {}

  std::chrono::steady_clock::time_point accepted_at() const { return accepted_at_; }
  size_t owned() const { return accounted_; }
  // Calls fn(buffer) once for each distinct shared buffer its queued replies reference.
  template <class Fn>
  void for_each_shared(Fn&& fn) const {
    std::unordered_set<const std::string*> seen;
    auto once = [&](const std::string& b) {
      if (seen.insert(&b).second) fn(b);
    };
    session_.output().for_each_shared(once);
    writing_.for_each_shared(once);
  }

  // Updates the server's total of buffered bytes with this connection's current holding; drops connections
  // when the total is over the budget.
  void account() {
    recount();
    if (server_->buffered() > server_->options.memory_budget) server_->enforce_budget();
  }
  void recount() {
    const size_t now =
        closed_ ? 0 : pending_.size() + session_.output().owned_bytes() + writing_.owned_bytes();
    server_->owned = server_->owned - accounted_ + now;
    accounted_ = now;
    server_->peak_buffered = std::max(server_->peak_buffered, server_->buffered());
  }
  // Reply bytes this client has not read yet (shared values at their length).
  size_t queued() const { return session_.output().size() + writing_.size(); }

  // Closes the connection from inside the store's notification loop: its output is discarded at once (it
  // must not keep growing), the close itself is posted.
  void close_soon(std::string reason) {
    if (closed_ || close_posted_) return;
    close_posted_ = true;
    session_.output().clear();
    recount();
    asio::post(server_->io, [self = shared_from_this(), reason = std::move(reason)] { self->close(reason); });
  }
  bool silent() const { return silent_; }
  bool closing() const { return closed_ || close_posted_; }

  void start() {
    socket_.set_option(tcp::no_delay(true));
    socket_.non_blocking(true);
    wait_readable();
  }

  // Closes the socket and forgets the connection. `reason` empty: the peer left or the server stops.
  void close(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    if (!reason.empty()) {
      ++server_->counters.dropped;
      spdlog::warn("store: dropping client {}: {}", peer_, reason);
    }
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    recount();  // closed: holds nothing any more
    server_->connections.erase(shared_from_this());
  }

 private:
  void wait_readable() {
    if (reading_ || closed_) return;
    reading_ = true;
    socket_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this()](const boost::system::error_code& ec) {
                         self->reading_ = false;
                         if (ec) {
                           if (ec != asio::error::operation_aborted) self->close("");
                           return;
                         }
                         self->on_readable();
                       });
  }

  void on_readable() {
    if (closed_) return;
    auto& scratch = server_->scratch;
    boost::system::error_code ec;
    size_t n = socket_.read_some(asio::buffer(scratch), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      wait_readable();
      return;
    }
    if (ec || n == 0) {
      close("");  // peer closed or reset: normal end of a client
      return;
    }
    silent_ = false;
    std::span<const uint8_t> input(scratch.data(), n);
    if (!pending_.empty()) {
      pending_.insert(pending_.end(), input.begin(), input.end());
      input = pending_;
    }
    size_t max_output = server_->options.max_output_bytes;
    server_->handling = this;
    auto result = session_.consume(input, max_output - std::min(max_output, writing_.size()));
    server_->handling = nullptr;
    server_->counters.requests += result.requests;
    if (!result.error.empty()) {
      flush();
      close(result.error);
      return;
    }
    keep_partial(input, result.consumed);
    if (closed_) return;
    flush();
    if (closed_) return;
    if (queued() > server_->options.max_output_bytes) {
      close("not reading its replies (" + std::to_string(queued()) + " bytes queued)");
      return;
    }
    account();
    if (closed_) return;
    if (!write_in_flight_ || session_.output().size() < kPauseReadingAt) wait_readable();
  }

  // Keeps the bytes of an incomplete request for the next read; arms the slow-client deadline.
  void keep_partial(std::span<const uint8_t> input, size_t consumed) {
    if (consumed == input.size()) {
      pending_.clear();
      pending_.shrink_to_fit();
      if (timer_armed_) {
        timer_armed_ = false;
        timer_.cancel();
      }
      return;
    }
    if (input.data() == pending_.data()) {
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(consumed));
    } else {
      pending_.assign(input.begin() + static_cast<ptrdiff_t>(consumed), input.end());
    }
    if (!timer_armed_) {
      timer_armed_ = true;
      timer_.expires_after(server_->options.request_timeout);
      timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec || !self->timer_armed_) return;
        self->timer_armed_ = false;
        self->close("request not completed within " +
                    std::to_string(self->server_->options.request_timeout.count()) + " ms (" +
                    std::to_string(self->pending_.size()) + " bytes received)");
      });
    }
  }

  // A wait completed or a watched key changed, while another client's request was being handled: send it,
  // and drop this client if it lets such notifications pile up past the output limit (a watcher that never
  // reads would otherwise hold every later write of its key in memory). The close is posted: this runs
  // inside the state's notification loop, which must not see the connection vanish under it.
  void on_async_output() {
    if (close_posted_) {
      session_.output().clear();  // being dropped: nothing more is kept for it
      return;
    }
    flush();
    if (closed_) return;
    if (queued() > server_->options.max_output_bytes) {
      close_soon("not reading its notifications (" + std::to_string(queued()) + " bytes queued)");
    }
    account();
  }

  // Writes everything queued with one gathering write: copied bytes and shared values (referenced, not
  // copied) in order.
  void flush() {
    if (write_in_flight_ || closed_ || session_.output().empty()) return;
    write_in_flight_ = true;
    writing_.swap(session_.output());
    gather_.clear();
    writing_.for_each_piece([this](const char* p, size_t n) { gather_.emplace_back(p, n); });
    auto done = [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
      self->write_in_flight_ = false;
      self->writing_.clear();
      self->account();
      if (ec) {
        if (ec != asio::error::operation_aborted) self->close("");
        return;
      }
      self->flush();
      self->wait_readable();
    };
    if (gather_.size() == 1) {
      asio::async_write(socket_, gather_.front(), std::move(done));  // small replies: one piece
    } else {
      asio::async_write(socket_, std::span<const asio::const_buffer>(gather_), std::move(done));
    }
  }

  std::shared_ptr<Impl> server_;
  tcp::socket socket_;
  std::string peer_;
  asio::steady_timer timer_;
  StoreSession session_;
  std::vector<uint8_t> pending_;
  ReplyQueue writing_;  // the replies being written; what the session queues meanwhile waits in its output()
  std::vector<asio::const_buffer> gather_;  // writing_'s pieces, for the write in flight
  bool reading_ = false;
  bool write_in_flight_ = false;
  bool timer_armed_ = false;
  bool closed_ = false;
  bool close_posted_ = false;
  bool silent_ = true;  // no byte received yet
  size_t accounted_ = 0;  // this connection's part of server_->owned
  std::chrono::steady_clock::time_point accepted_at_ = std::chrono::steady_clock::now();
};

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
  std::unordered_map<const std::string*, size_t> holders;  // shared buffer -> connections referencing it
  for (const auto& c : connections) c->for_each_shared([&](const std::string& b) { ++holders[&b]; });
  std::vector<std::pair<size_t, std::shared_ptr<Connection>>> ranked;
  ranked.reserve(connections.size());
  for (const auto& c : connections) {
    size_t held = c->owned();
    c->for_each_shared([&](const std::string& b) { held += b.size() / holders[&b]; });
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

// Near the connection limit, closes connections that never sent a byte for silent_timeout, oldest first.
void StoreServer::Impl::reclaim_silent() {
  if (connections.size() * 10 < options.max_connections * 9) return;
  const auto cutoff = std::chrono::steady_clock::now() - options.silent_timeout;
  while (!silent.empty() && connections.size() * 10 >= options.max_connections * 9) {
    auto c = silent.front().lock();
    if (c && c->silent() && c->accepted_at() > cutoff) return;  // the oldest silent one is still young
    silent.pop_front();
    if (c && c->silent()) {
      c->close("silent for " + std::to_string(options.silent_timeout.count()) +
               " ms while the store is near its connection limit");
    }
  }
}

void StoreServer::Impl::accept() {
  acceptor.async_accept([keep = self.lock(), this](const boost::system::error_code& ec, tcp::socket socket) {
    if (stopped) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) accept_failed(ec);
      return;
    }
    reclaim_silent();
    if (connections.size() >= options.max_connections) {
      refuse(std::move(socket));
    } else {
      boost::system::error_code pec;
      auto remote = socket.remote_endpoint(pec);
      std::string peer = pec ? std::string("unknown peer") : describe(remote);
      ++counters.accepted;
      auto conn = std::make_shared<Connection>(keep, std::move(socket), std::move(peer));
      connections.insert(conn);
      silent.push_back(conn);
      if (silent.size() > 2 * connections.size() + 64) {  // drop the expired entries now and then
        std::erase_if(silent, [](const auto& w) {
          auto c = w.lock();
          return !c || !c->silent();
        });
      }
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
  return lim.rlim_cur > 2 * reserve ? static_cast<size_t>(lim.rlim_cur - reserve) : static_cast<size_t>(lim.rlim_cur / 2);
}

}  // namespace

size_t default_memory_budget(const WireLimits& limits) {
  return 4 * limits.max_value_bytes;
}

StoreServer::StoreServer(asio::io_context& io, StoreServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  impl_->options.max_connections = connection_limit(impl_->options.max_connections);
  if (impl_->options.memory_budget == 0) {
    impl_->options.memory_budget = default_memory_budget(impl_->options.limits);
  }
  impl_->self = impl_;
  for (const auto& [key, value] : impl_->options.preset) impl_->state.set(key, value);
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
  return s;
}

}  // namespace ddprun::rdzv
