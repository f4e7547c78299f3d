// The store server's insides (rendezvous/store_server.h): what every connection shares (StoreServer::Impl)
// and one client's connection (StoreServer::Connection, store_connection.cc). Private to store_server.cc and
// store_connection.cc; single-threaded, like the server: everything runs on its io_context's thread.
#pragma once

#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20
#include <vector>

#include "rendezvous/store/auth_workers.h"
#include "rendezvous/store/key_value_state.h"
#include "rendezvous/store/refusal_log.h"
#include "rendezvous/store/reply_queue.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/store_session.h"

namespace ddprun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kScratchBytes = 256 * 1024;
// Stop reading from a client while this much of its output waits behind a write in flight.
constexpr size_t kPauseReadingAt = 4 * 1024 * 1024;

// Everything the connections share. Lives as long as the longest-lived connection handler.
class StoreServer::Impl {
 public:
  Impl(asio::io_context& io, StoreServerOptions options)
      : io(io),
        options(std::move(options)),
        acceptor(io),
        retry_timer(io),
        auth_workers(this->options.auth_threads, this->options.auth_queue) {}

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
  // Connections not established yet (StoreSession::established()), oldest first (expired entries skipped).
  std::deque<std::weak_ptr<Connection>> silent;
  // Of those, the ones from addresses that were not the job's when they connected (a store with a secret),
  // oldest first; and how many are open per source (refusal_log.h: an address, an IPv6 /64).
  std::deque<std::weak_ptr<Connection>> strangers;
  std::unordered_map<std::string, size_t> handshaking;
  // Of those, the ones that have sent something (VALIDATE, PING, AUTH), oldest first by their first bytes.
  std::deque<std::weak_ptr<Connection>> handshake_only;
  // Bytes the connections hold copies of (unfinished requests, copied reply bytes), all connections; with
  // shared.bytes(), what is held for clients (the memory budget's measure).
  size_t owned = 0;
  size_t peak_buffered = 0;
  size_t buffered() const { return owned + shared.bytes(); }
  const Connection* handling = nullptr;  // the connection whose requests are being handled right now
  // Admission with a secret (StoreServerOptions::auth): this host's addresses, the addresses with an
  // authenticated agent connection open (how many), and which refusals are logged.
  std::unordered_set<std::string> own_addresses;
  std::unordered_map<std::string, int> agent_addresses;
  RefusalLog refusal_log;
  bool admitted(const std::string& address) const {
    return own_addresses.count(address) > 0 || agent_addresses.count(address) > 0;
  }
  // A client refused (by the admission, or closed before it authenticated): logged once a minute per source.
  void note_refusal(const std::string& address, const std::string& peer, const std::string& why);
  // The blocking AUTH steps' threads. Declared last: stopped (joined) before the rest goes.
  AuthWorkers auth_workers;

  void bind();
  void accept();
  void accept_failed(const boost::system::error_code& ec);
  void refuse(tcp::socket socket);
  void reclaim_silent();
  // At max_connections, to make room for a newcomer: closes the oldest stranger's connection that has not
  // authenticated, else the oldest one that sent nothing but VALIDATE, PING or AUTH for handshake_timeout
  // (from any address: a silent one, torch 1.13's idle callback connection, is left to reclaim_silent());
  // false when there is none.
  bool evict_for_newcomer();
  // Over memory_budget: drops the connections holding the most until under it again.
  void enforce_budget();
  // Each connection's holding: its own copies, plus its part of every shared buffer it references (a buffer
  // referenced by n connections counts 1/n to each), largest first.
  std::vector<std::pair<size_t, std::shared_ptr<Connection>>> holdings() const;
};

class StoreServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `address`: the peer's IP address alone (IPv4-mapped IPv6 as IPv4), for the admission. `stranger`: the
  // address was not the job's when it connected (a store with a secret): it gets handshake_timeout to
  // authenticate and counts in server->handshaking until it is established or closed.
  Connection(std::shared_ptr<Impl> server, tcp::socket socket, std::string peer, std::string address,
             bool stranger);

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
  void account();
  void recount();
  // Reply bytes this client has not read yet (shared values at their length).
  size_t queued() const { return session_.output().size() + writing_.size(); }

  // Closes the connection from inside the store's notification loop: its output is discarded at once (it
  // must not keep growing), the close itself is posted.
  void close_soon(std::string reason);
  // Not established (StoreSession::established()): what reclaim_silent() and evict_for_newcomer() may close.
  bool silent() const { return !established_; }
  // When it first sent bytes (time_point{}: never).
  std::chrono::steady_clock::time_point spoke_at() const { return spoke_at_; }
  bool closing() const { return closed_ || close_posted_; }
  const std::string& address() const { return address_; }
  // Closes a connection that did not authenticate (a stranger's): counted and logged as a refusal.
  void drop_handshake(const std::string& why);

  void start();

  // Closes the socket and forgets the connection. `reason` empty: the peer left or the server stops.
  void close(const std::string& reason);

 private:
  void wait_readable();

  void on_readable();
  // Handles `input` (the bytes read, or pending_ itself), then writes what the session owes and reads on.
  void process(std::span<const uint8_t> input);
  // The session stopped at a blocking AUTH step: runs it on the auth workers; auth_done() gets the outcome
  // back on the store's thread and goes on with the bytes that followed (kept in pending_).
  void run_auth_step();
  void auth_done(StoreSession::AuthOutcome outcome);
  // After the session handled requests, or an AUTH step's outcome: a refusal or an error closes the
  // connection (false); else true, and once the session is established its handshake deadline and the
  // per-address count no longer apply (note_established).
  bool settle(const StoreSession::ConsumeResult& result);
  void note_established();

  // Keeps the bytes of an incomplete request for the next read; arms the slow-client deadline.
  void keep_partial(std::span<const uint8_t> input, size_t consumed);
  // Keeps what follows the consumed bytes in pending_.
  void keep_rest(std::span<const uint8_t> input, size_t consumed);

  // A wait completed or a watched key changed, while another client's request was being handled: send it,
  // and drop this client if it lets such notifications pile up past the output limit (a watcher that never
  // reads would otherwise hold every later write of its key in memory). The close is posted: this runs
  // inside the state's notification loop, which must not see the connection vanish under it.
  void on_async_output();

  // Writes everything queued with one gathering write: copied bytes and shared values (referenced, not
  // copied) in order.
  void flush();

  std::shared_ptr<Impl> server_;
  tcp::socket socket_;
  std::string peer_;
  std::string address_;
  bool agent_counted_ = false;     // in server_->agent_addresses
  bool stranger_counted_ = false;  // in server_->handshaking
  asio::steady_timer timer_;
  asio::steady_timer handshake_timer_;  // a stranger's handshake_timeout
  StoreSession session_;
  std::vector<uint8_t> pending_;
  ReplyQueue writing_;  // the replies being written; what the session queues meanwhile waits in its output()
  std::vector<asio::const_buffer> gather_;  // writing_'s pieces, for the write in flight
  bool reading_ = false;
  bool write_in_flight_ = false;
  bool timer_armed_ = false;
  bool closed_ = false;
  bool close_posted_ = false;
  bool established_ = false;   // session_.established(), as last seen
  bool auth_running_ = false;  // an AUTH step is on the auth workers: nothing is read meanwhile
  size_t accounted_ = 0;       // this connection's part of server_->owned
  std::chrono::steady_clock::time_point accepted_at_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point spoke_at_{};
};

}  // namespace ddprun::rdzv
