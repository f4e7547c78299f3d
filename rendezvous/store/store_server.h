// StoreServer: the rendezvous store as a TCP server speaking PyTorch's TCPStore protocol.
//
// Event-driven on one boost::asio::io_context: no thread per client; all state is touched only from the
// io_context's thread, so nothing is locked. Idle connections hold no read buffer (a readiness wait plus
// a shared scratch buffer), which is how one server holds tens of thousands of them.
//
// Replies reference stored values instead of copying them (shared_value.h, reply_queue.h) and are written
// with gathering writes: a value read by 1000 clients, or carried by the notifications of 100 watchers, is in
// memory once.
//
// Protection: a client that sends garbage, an unknown command, a length over the limits, a request that
// does not complete within `request_timeout`, or that stops reading while its replies (or its wait and
// watch notifications) pile up past `max_output_bytes`, is dropped with one log line; so are the clients
// holding the most when all together hold more than `memory_budget`. Every other client keeps being served
// and no stored data is lost. At `max_connections` a newcomer takes the place of the oldest connection that
// sent nothing but VALIDATE, PING or AUTH for `handshake_timeout` (nothing served: not established,
// StoreSession), and is closed at accept when there is none; near that limit, connections that were never
// established for `silent_timeout` (torch 1.13's callback connection sends nothing for long) are reclaimed
// oldest first. Accept errors (out of descriptors) and refusals are logged at most once a second with a
// count.
//
// With a secret (`auth`), strangers cannot hold the store's connections: a connection from an address that
// is not the job's (StoreSession's admission) must authenticate within `handshake_timeout`; at most
// `max_handshakes_per_address` such connections per address (an IPv6 /64) are open at once; and at the
// connection limit the oldest of them makes room for a newcomer at once, whatever its age. An auth whose
// proofs block (MUNGE) runs them on `auth_threads` threads of their own (AuthWorkers), never on the event
// loop's, with at most `auth_queue` handshakes waiting. What they refuse is logged once a minute per address
// (RefusalLog).
//
// Threads: construct, stop() and stats() on the io_context's thread (or before it runs). Use
// StoreServerThread for a server with a thread of its own.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "rendezvous/store/store_auth.h"
#include "rendezvous/store/store_stats.h"
#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv {

struct StoreServerOptions {
  // Address to bind: "" or "::" = every interface (IPv6 dual-stack, falling back to 0.0.0.0), or a host
  // name / IPv4 / IPv6 literal. Port 0 picks a free port (see StoreServer::port()).
  std::string host;
  uint16_t port = 0;
  WireLimits limits;
  std::optional<Dialect> dialect;  // nullopt: detect per connection
  // 0: the process's file-descriptor limit (its soft limit, first raised to the hard one) minus 64 kept for
  // the rest of the process; connections beyond are closed at accept.
  size_t max_connections = 0;
  // Unread replies per connection, as the client would read them: a shared value counts at its length each
  // time it is queued (a few bytes of pipelined GETs must not commit a client to gigabytes of replies).
  size_t max_output_bytes = 256 * 1024 * 1024;
  // Memory held for clients, all connections together: bytes of unfinished requests, reply bytes copied into
  // queues, and the stored values that queued replies reference, each buffer counted once however many
  // queues reference it. Over it, the connections holding the most (a shared buffer counted 1/n to each of
  // its n holders), each over its share (the budget divided by the connections), are dropped (one log line
  // each) until it is met again; stored keys do not count and are never dropped. 0: the default,
  // default_memory_budget(limits).
  size_t memory_budget = 0;
  // Called on the server's thread with each connection-bound key (KeyValueState::connection_bound) removed
  // because its connection closed: a killed agent's live/ key. Must not block.
  std::function<void(const std::string& key)> on_connection_key_released;
  std::chrono::milliseconds request_timeout{30000};
  // A connection that was not established for this long (nothing served beyond VALIDATE, PING and AUTH) may
  // be closed, oldest first, when the server holds more than 90% of max_connections (torch 1.13's callback
  // connection legitimately stays silent: only a server short of descriptors reclaims silent ones).
  std::chrono::milliseconds silent_timeout{30000};
  int backlog = 4096;
  // The job's secret (store_auth.h, docs/security.md): set, only agents that prove it may touch the job's
  // keys, and other clients are served only from the addresses of the job's nodes (StoreSession's admission);
  // refused clients are closed and logged once per address per minute. Null: an open store, as torch's.
  std::shared_ptr<const StoreAuth> auth;
  // See the top of this file: a stranger's time to authenticate (with `auth`; an agent does it in a few
  // round trips), and how long a connection may send only VALIDATE, PING or AUTH before a newcomer at the
  // connection limit takes its place (any store).
  std::chrono::milliseconds handshake_timeout{10000};
  size_t max_handshakes_per_address = 128;
  // Threads for the blocking AUTH steps (StoreAuth::blocks(): MUNGE), and how many steps may wait for them
  // (each connection has at most one; beyond, the handshake is refused, saying so).
  size_t auth_threads = 4;
  size_t auth_queue = 65536;
  // Keys (as stored: with the client's "/" prefix) that hold their value before the first request is read.
  std::vector<std::pair<std::string, std::string>> preset;
};

// The default memory budget: four of the largest values the limits admit (256 MiB with the default limits):
// the largest request (a COMPARE_SET or MULTI_SET carries two values) twice over, so that a client sending it
// is not dropped for it while others hold a little. Ordinary
// traffic holds far less (torch clients have one request in flight; a value read by every rank is held
// once); the budget bounds what hostile or stuck clients can make a store beside the training processes
// hold, a quarter of the 1 GiB of earlier versions.
size_t default_memory_budget(const WireLimits& limits);

class StoreServer {
 public:
  // Binds and listens before returning; throws BindError naming addr:port and what to do.
  StoreServer(boost::asio::io_context& io, StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  // The bound address as "addr:port" (e.g. "[::]:29500").
  std::string local_endpoint() const;
  // Closes the listening socket and every connection. Idempotent.
  void stop();
  StoreServerStats stats() const;

 private:
  class Impl;
  class Connection;
  std::shared_ptr<Impl> impl_;
};

// A StoreServer running on a thread of its own. Thread-safe: every method may be called from any thread.
class StoreServerThread {
 public:
  explicit StoreServerThread(StoreServerOptions options);  // throws BindError
  ~StoreServerThread();                                    // stops and joins
  StoreServerThread(const StoreServerThread&) = delete;
  StoreServerThread& operator=(const StoreServerThread&) = delete;

  uint16_t port() const { return port_; }
  std::string local_endpoint() const { return endpoint_; }
  StoreServerStats stats();
  void stop();

 private:
  boost::asio::io_context io_;
  std::unique_ptr<StoreServer> server_;
  uint16_t port_ = 0;
  std::string endpoint_;
  std::thread thread_;
};

}  // namespace ddprun::rdzv
