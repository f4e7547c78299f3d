// EtcdStore: the Store interface (store.h) on etcd's v2 keys API, byte for byte as torch's EtcdStore
// (torch/distributed/elastic/rendezvous/etcd_store.py) keeps it, so that torchrun's agents and ddprun's read
// each other's keys: key K lives at "<prefix>/<base64(K)>", its value is base64(V); a counter (add) is the
// decimal text of the number, base64-encoded.
//
// Waits (get, wait, multi_get) read and then long-poll etcd (a watch from the index of the read), so that a
// key written a moment later is seen at once; no polling. Every call is bounded: a wait by its timeout, every
// request by the client's request timeout on each member tried.
//
// Differences from torch's, none of them visible to a torch peer: get() of one key reads that key (torch
// lists the whole prefix); compare_set/delete_key/num_keys/append/multi_* exist (torch's raise or use the
// slow defaults). Keys whose base64 holds a '/' nest under the prefix (etcd splits paths on '/'); torch's
// listing then never finds them, ddprun's single-key reads do, and its listings walk the subtree.
//
// Threads: as the client (etcd_client.h), one call at a time. Errors: the client's (EtcdUnavailableError,
// ...) and WaitTimeoutError for a wait that ran out; BadReplyError naming the etcd key for a value that is
// not base64 (or, for add, not a number): somebody else's data under the prefix.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/store/store.h"

namespace ddprun::rdzv::etcd {

std::string base64_encode(std::string_view bytes);
// nullopt when `text` is not base64 (padding included) of some bytes.
std::optional<std::string> base64_decode(std::string_view text);

class EtcdStore final : public Store {
 public:
  // `client` is shared with nobody that calls it from another thread at the same time. `prefix` is an etcd
  // directory ("/torchelastic/p2p/run_x/rdzv/v_1/kv"); a trailing '/' is added when missing.
  EtcdStore(std::shared_ptr<Client> client, std::string prefix, std::chrono::milliseconds timeout);

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

  // Waits until at least one key of every group exists (or `timeout`: WaitTimeoutError); returns, per group,
  // the index of the first key found and its value. For peers that write one datum under either of two names
  // (torch 1.13's and 2.x's agents name their role infos differently).
  struct Found {
    size_t which = 0;
    std::string value;
  };
  std::vector<Found> wait_any(const std::vector<std::vector<std::string>>& groups,
                              std::chrono::milliseconds timeout);

  // The etcd path of `key` ("<prefix><base64(key)>").
  std::string path(std::string_view key) const;
  const std::string& prefix() const { return prefix_; }
  Client& client() { return *client_; }

 private:
  // The values of every key under the prefix (decoded key -> etcd node), and the index to watch from.
  struct Listing;
  Listing list();
  std::string decode_value(const Node& node) const;
  std::string get_within(std::string_view key, std::chrono::milliseconds timeout);
  std::vector<std::string> multi_get_within(const std::vector<std::string>& keys,
                                            std::chrono::milliseconds timeout);

  std::shared_ptr<Client> client_;
  std::string prefix_;
};

}  // namespace ddprun::rdzv::etcd
