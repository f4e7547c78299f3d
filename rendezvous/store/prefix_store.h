// PrefixStore: a namespace inside another store, wire-compatible with torch's PrefixStore.
//
// Every key K becomes "<prefix>/K" in the underlying store, exactly as c10d::PrefixStore does, so a
// ddprun agent and torch workers see the same keys. Shares the underlying store (which must be
// thread-safe for concurrent use; StoreClient is). The timeout is the underlying store's at construction.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store/store.h"

namespace ddprun::rdzv {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

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

  const std::string& prefix() const { return prefix_; }
  Store& base() { return *base_; }

 private:
  std::string key(std::string_view k) const;
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace ddprun::rdzv
