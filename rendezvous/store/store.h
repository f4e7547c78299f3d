// Store: the key-value interface every rendezvous participant uses (agents, the worker SDK, tests).
//
// Same operations and semantics as PyTorch's c10d::Store. Implementations: StoreClient (TCP, talks to a
// StoreServer or to torch's own TCPStore) and PrefixStore (a namespace over another store).
// Every blocking call has a deadline: the store's timeout() unless a call takes one explicitly; on expiry it
// throws TimeoutError. Errors are the types of store_error.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rdzv {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(std::string_view key, std::string_view value) = 0;
  // Waits up to timeout() for the key to exist, then returns its value.
  virtual std::string get(std::string_view key) = 0;
  // Adds `delta` to the integer stored at `key` (missing = 0) and returns the new value; add(k, 0) reads.
  virtual int64_t add(std::string_view key, int64_t delta) = 0;
  // Atomically: if the key holds `expected` (or is missing and `expected` is empty) store `desired`.
  // Returns the value now stored (or `expected` when the key is missing and expected is non-empty).
  virtual std::string compare_set(std::string_view key, std::string_view expected,
                                  std::string_view desired) = 0;
  // True when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists or `timeout` passes (TimeoutError).
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Returns true when the key existed.
  virtual bool delete_key(std::string_view key) = 0;
  // Number of keys in the whole store (not only under a prefix, as in torch).
  virtual int64_t num_keys() = 0;
  virtual void append(std::string_view key, std::string_view value) = 0;
  // Waits for every key (as get), then returns their values in order.
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys) = 0;
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) = 0;
  // Releases the connection; later calls throw ClosedError where the implementation has one to release (a
  // call in progress on another thread ends). Idempotent; by default nothing to do.
  virtual void close() {}

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 protected:
  explicit Store(std::chrono::milliseconds timeout) : timeout_(timeout) {}

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace ddprun::rdzv
