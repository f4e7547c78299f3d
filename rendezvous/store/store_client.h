// StoreClient: a blocking TCPStore client with deadlines, for agents, the worker SDK and tools.
//
// Talks to a ddprun StoreServer or to PyTorch's own TCPStore server. Keys are sent with torch's TCPStore
// client prefix "/" (options.key_prefix), so `set("k")` here and `TCPStore.set("k")` in Python touch the
// same key; the internal "init/" key is reachable with an empty prefix.
//
// Threads: every method is thread-safe (one request at a time on the one connection, like torch's client).
// Deadlines: connecting retries with exponential backoff (50 ms doubling to 1 s) until connect_timeout;
// every request waits at most `timeout()` (or the timeout given to wait()) for its reply.
// Errors: TimeoutError (WaitTimeoutError: a WAIT's keys did not appear in time; HandshakeTimeoutError: the
// store was silent at the modern handshake), AuthenticationError (options.auth: no shared secret),
// ConnectionLostError (the connection is then re-established by
// the next call), ClosedError after close(), BadReplyError, InvalidArgumentError (see store_error.h).
// Messages name host:port and the operation.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/store/store.h"
#include "rendezvous/store/store_auth.h"
#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv {

struct StoreClientOptions {
  // kModern for ddprun servers and torch >= 2.x; kLegacy for torch 1.13/2.0 servers.
  Dialect dialect = Dialect::kModern;
  std::chrono::milliseconds connect_timeout{60000};
  std::chrono::milliseconds timeout{300000};
  std::string key_prefix = "/";
  WireLimits limits;  // replies longer than limits.max_value_bytes are BadReplyError
  // The job's secret (modern dialect): every connection proves it to the store and checks the store's proof
  // (store_auth.h) before its first request; AuthenticationError when they do not match. Null: none.
  std::shared_ptr<const StoreAuth> auth;
  // With `auth`: prove it as an observer (`ddprun status`): the store lets this client read the job's keys,
  // never write, and does not admit its address (store_session.h). False: as an agent.
  bool observer = false;
};

class StoreClient final : public Store {
 public:
  // Connects (and, in the modern dialect, validates and pings) before returning.
  StoreClient(std::string host, uint16_t port, StoreClientOptions options = {});
  ~StoreClient() override;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  int64_t add(std::string_view key, int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;

  // Modern dialect only (InvalidArgumentError otherwise).
  void queue_push(std::string_view key, std::string_view value);
  // Waits up to `timeout` for an element when `block`; returns nullopt when the queue is empty.
  std::optional<std::string> queue_pop(std::string_view key, bool block, std::chrono::milliseconds timeout);
  int64_t queue_len(std::string_view key);
  // Round trip to the server; returns the time it took.
  std::chrono::microseconds ping();

  // How long each later reconnection keeps trying (the first connection used options.connect_timeout).
  void set_connect_timeout(std::chrono::milliseconds timeout);

  // Closes the connection; later calls throw ClosedError. Idempotent.
  void close() override;
  const std::string& endpoint() const { return endpoint_; }
  Dialect dialect() const { return options_.dialect; }

 private:
  class Connection;

  // Sends `req` (keys already prefixed) on a live connection, reconnecting first if the last one broke.
  Connection& send(const Request& req, std::chrono::steady_clock::time_point deadline);
  void connect_locked();
  // AUTH (store_auth.h) on a fresh connection; AuthenticationError.
  void authenticate(Connection& conn, std::chrono::steady_clock::time_point deadline);
  std::string prefixed(std::string_view key) const;
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;
  void wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  std::string describe(Op op, std::string_view key) const;

  std::string host_;
  uint16_t port_;
  std::string endpoint_;
  StoreClientOptions options_;
  std::mutex mu_;
  std::unique_ptr<Connection> conn_;  // guarded by mu_; null when broken
  bool closed_ = false;               // guarded by mu_
};

}  // namespace ddprun::rdzv
