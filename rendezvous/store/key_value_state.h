// The data of a rendezvous store: keys, values, queues, and who waits for which key.
//
// Pure and single-threaded: no sockets, no clocks, no locks. The server owns one instance and touches it
// only from its io_context thread; tests and the fuzzer drive it directly. Callbacks registered with wait()
// and watch() run synchronously inside the mutating call that triggers them (set, add, append, ...), after
// the state is updated; they may read the state but must not register or cancel waits/watches re-entrantly
// other than their own (the state tolerates a callback cancelling itself).
//
// Values are SharedValues (shared_value.h): immutable buffers that replies and notifications reference
// instead of copying. A write replaces a key's buffer; the old one lives on while a queued reply holds it.
//
// Semantics follow PyTorch's TCPStore server (docs/wire-protocol.md):
//  - add() stores the integer as ASCII decimal; a missing key counts as 0.
//  - compare_set(): missing key + empty expected -> store desired; missing + non-empty expected -> no
//    change, returns expected; present -> replace only when equal to expected; returns the current value.
//  - A waiter fires once, when each of its keys has been written once since it registered (TCPStore counts
//    writes, not presence, so a key deleted after being written still counts).
//
// Worker keyspaces (docs/rendezvous.md, "A clean keyspace for every attempt"): the agents' keys live under
// "/ddprun/"; every other key belongs to the workers. When a round completes, an agent writes the round's
// keyspace name to kWorkerKeyspaceKey. A session binds to the keyspace that is current when it first names a
// worker key, and from then on its worker keys are stored under that keyspace's prefix, so the workers of
// one attempt never see a key of an earlier attempt, even from a straggler still running. A keyspace's keys
// are erased once it is neither current nor bound by any session.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rendezvous/store/shared_value.h"
#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv {

class KeyValueState {
 public:
  using HandleId = uint64_t;
  using ReadyFn = std::function<void()>;
  // Legacy WATCH_KEY: event, key, old value (null when created), new value (null when deleted).
  using WatchFn = std::function<void(WatchEvent, const std::string& key, const SharedValue& old_value,
                                     const SharedValue& new_value)>;

  KeyValueState() = default;
  KeyValueState(const KeyValueState&) = delete;
  KeyValueState& operator=(const KeyValueState&) = delete;

  void set(const std::string& key, std::string value);
  // The key's bytes, or nullptr when it is missing; valid until the key is next written.
  const std::string* get(const std::string& key) const;
  // The key's buffer, to reference rather than copy (null when the key is missing).
  const SharedValue& shared(const std::string& key) const;
  // Returns nullopt (and changes nothing) when the current value is not a decimal integer or the sum
  // overflows.
  std::optional<int64_t> add(const std::string& key, int64_t delta);
  // Returns the value now stored (or `expected` when the key is missing and expected is non-empty).
  SharedValue compare_set(const std::string& key, std::string expected, std::string desired);
  bool check(const std::vector<std::string>& keys) const;
  bool remove(const std::string& key);
  int64_t num_keys() const { return static_cast<int64_t>(values_.size()); }
  // Keys that start with `prefix` (a keyspace's), without building a list.
  int64_t count_keys(std::string_view prefix) const;
  std::vector<std::string> list_keys() const;
  // Appends in place when no reply references the value, else makes a new buffer.
  void append(const std::string& key, std::string_view value);

  // Queues (modern QUEUE_PUSH/POP/LEN) live beside the keys. WAIT and CHECK count a non-empty queue as
  // present; a push wakes one waiter of the queue's key (the one that will pop it), as torch's libuv server.
  void queue_push(const std::string& key, std::string value);
  SharedValue queue_pop(const std::string& key);  // null when the queue is empty
  int64_t queue_len(const std::string& key) const;

  // Registers `on_ready` to run once when every key in `keys` has been written. Returns nullopt (and
  // drops on_ready) when all keys already exist.
  std::optional<HandleId> wait(const std::vector<std::string>& keys, ReadyFn on_ready);
  // Forgets a pending wait; returns false if it already fired or was cancelled.
  bool cancel_wait(HandleId id);
  HandleId watch(const std::string& key, WatchFn fn);
  void unwatch(HandleId id);

  // The key whose value names the current worker keyspace, and the agents' namespace that is never scoped,
  // as keys on the wire: StoreClient, like torch's TCPStore client, puts "/" before the key it is given.
  static constexpr std::string_view kAgentNamespace = "/ddprun/";
  static constexpr std::string_view kWorkerKeyspaceKey = "/ddprun/worker_keyspace";
  // Binds a session to the current keyspace; returns the prefix its worker keys get ("" when no keyspace
  // was ever set: a plain store). Every bind is paired with one unbind_keyspace(prefix) (the session's end).
  std::string bind_keyspace();
  void unbind_keyspace(const std::string& prefix);
  // Keys stored under `prefix` (for a scoped session's GETNUMKEYS and LIST_KEYS).
  std::vector<std::string> list_keys(std::string_view prefix) const;
  size_t keyspaces() const { return keyspace_refs_.size(); }

  // Connection-bound keys (etcd's leases, ZooKeeper's ephemeral nodes): an agent key with a "/live/" path
  // component ("/ddprun/<run id>/live/<agent>") lives as long as the session that last SET it. The agents of
  // a job keep one each, so that the others learn that an agent is gone as soon as its connection closes (a
  // killed process), without waiting for missed heartbeats (docs/rendezvous.md, "Who is alive").
  static bool connection_bound(std::string_view key);
  // `owner` (a session's id) SET the connection-bound `key`: it is removed when that owner releases, unless
  // another owner SET it since.
  void bind_to_owner(const std::string& key, uint64_t owner);
  // The owner's connection closed: removes the connection-bound keys it still owns, and tells the release
  // hook (set_release_hook) each key it removed (not one that was deleted already). O(keys it owns).
  void release_owner(uint64_t owner);
  // Called with every key release_owner removes (a killed agent's live/ key), synchronously: it must not
  // block nor call back into this state.
  void set_release_hook(std::function<void(const std::string& key)> hook) { release_hook_ = std::move(hook); }

  size_t pending_waits() const { return waiters_.size(); }
  // Keys with at least one waiter entry (a cancelled wait leaves none behind).
  size_t waited_keys() const { return waiters_by_key_.size(); }
  size_t watches() const { return watchers_.size(); }
  // Sum of key and value sizes, for stats and limits.
  size_t stored_bytes() const { return stored_bytes_; }

 private:
  struct Waiter {
    size_t missing = 0;
    ReadyFn on_ready;
    std::vector<std::string> keys;  // the keys it was entered under in waiters_by_key_
  };
  struct Watcher {
    std::string key;
    WatchFn fn;
  };

  // Runs after every write of `key`: wakes waiters, notifies watchers.
  void written(const std::string& key, WatchEvent event, const SharedValue& old_value,
               const SharedValue& new_value, bool wake_one = false);
  void notify_watchers(const std::string& key, WatchEvent event, const SharedValue& old_value,
                       const SharedValue& new_value);
  // Stores `value` at `key`, in the key's buffer when no one else references it (else in a new one); returns
  // the stored buffer (a reference into values_).
  const SharedValue& store(const std::string& key, std::string value);
  // The key's current buffer when someone watches it (a notification needs it), else null.
  SharedValue old_for_watchers(const std::string& key, const SharedValue& current) const;
  // Erases the keys and queues of every keyspace that is neither current nor bound.
  void collect_keyspaces();
  std::string current_keyspace_prefix() const;

  std::unordered_map<std::string, SharedValue> values_;  // never null
  std::unordered_map<std::string, std::deque<SharedValue>> queues_;
  // Per key, the ids of its waiters and watchers in registration order (ids grow): O(log n) to add or drop
  // one, so many waits on one key cost n log n in all, not n^2.
  std::unordered_map<HandleId, Waiter> waiters_;
  std::unordered_map<std::string, std::set<HandleId>> waiters_by_key_;
  std::unordered_map<HandleId, Watcher> watchers_;
  std::unordered_map<std::string, std::set<HandleId>> watchers_by_key_;
  std::unordered_map<std::string, size_t> keyspace_refs_;  // prefix -> sessions bound to it
  std::unordered_map<std::string, uint64_t> key_owner_;    // connection-bound key -> its owner
  std::unordered_map<uint64_t, std::unordered_set<std::string>> owned_keys_;  // the same, by owner
  HandleId next_id_ = 1;
  std::function<void(const std::string&)> release_hook_;
  size_t stored_bytes_ = 0;
};

}  // namespace ddprun::rdzv
