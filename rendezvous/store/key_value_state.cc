#include "rendezvous/store/key_value_state.h"

#include <algorithm>

#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

const SharedValue& KeyValueState::store(const std::string& key, std::string value) {
  auto [it, inserted] = values_.try_emplace(key);
  if (inserted) {
    stored_bytes_ += key.size();
  } else {
    stored_bytes_ -= it->second->size();
  }
  stored_bytes_ += value.size();
  if (!inserted && it->second.use_count() == 1) {
    // Nobody else holds the buffer (no queued reply, no watcher's old value): reuse it, as a map of strings
    // would. It was made non-const by make_shared_value, so this is allowed.
    const_cast<std::string&>(*it->second) = std::move(value);
  } else {
    it->second = make_shared_value(std::move(value));
  }
  return it->second;
}

SharedValue KeyValueState::old_for_watchers(const std::string& key, const SharedValue& current) const {
  return watchers_by_key_.count(key) ? current : SharedValue();
}

void KeyValueState::set(const std::string& key, std::string value) {
  auto it = values_.find(key);
  const bool existed = it != values_.end();
  SharedValue old = existed ? old_for_watchers(key, it->second) : SharedValue();
  const SharedValue& now = store(key, std::move(value));
  written(key, existed ? WatchEvent::kKeyUpdated : WatchEvent::kKeyCreated, old, now);
}

const std::string* KeyValueState::get(const std::string& key) const {
  return shared(key).get();
}

const SharedValue& KeyValueState::shared(const std::string& key) const {
  static const SharedValue kNone;
  auto it = values_.find(key);
  return it == values_.end() ? kNone : it->second;
}

std::optional<int64_t> KeyValueState::add(const std::string& key, int64_t delta) {
  auto it = values_.find(key);
  int64_t current = 0;
  const bool existed = it != values_.end();
  SharedValue old;
  if (existed) {
    auto parsed = parse_int(*it->second);
    if (!parsed) return std::nullopt;
    current = *parsed;
    old = old_for_watchers(key, it->second);
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) return std::nullopt;
  const SharedValue& now = store(key, std::to_string(result));
  written(key, existed ? WatchEvent::kKeyUpdated : WatchEvent::kKeyCreated, old, now);
  return result;
}

SharedValue KeyValueState::compare_set(const std::string& key, std::string expected, std::string desired) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    if (!expected.empty()) return make_shared_value(std::move(expected));
    const SharedValue& now = store(key, std::move(desired));
    written(key, WatchEvent::kKeyCreated, nullptr, now);
    return now;
  }
  if (*it->second == expected) {
    SharedValue old = it->second;  // kept alive: the notification carries it
    const SharedValue& now = store(key, std::move(desired));
    written(key, WatchEvent::kKeyUpdated, old, now);
    return now;
  }
  return it->second;
}

bool KeyValueState::check(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& k) { return values_.count(k) || queues_.count(k); });
}

bool KeyValueState::remove(const std::string& key) {
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  SharedValue old = std::move(it->second);
  stored_bytes_ -= key.size() + old->size();
  values_.erase(it);
  notify_watchers(key, WatchEvent::kKeyDeleted, old, nullptr);
  return true;
}

bool KeyValueState::connection_bound(std::string_view key) {
  return key.starts_with(kAgentNamespace) && key.find("/live/") != std::string_view::npos;
}

void KeyValueState::bind_to_owner(const std::string& key, uint64_t owner) {
  auto [it, inserted] = key_owner_.try_emplace(key, owner);
  if (!inserted && it->second != owner) {
    if (auto was = owned_keys_.find(it->second); was != owned_keys_.end()) {
      was->second.erase(key);
      if (was->second.empty()) owned_keys_.erase(was);
    }
    it->second = owner;
  }
  owned_keys_[owner].insert(key);
}

void KeyValueState::release_owner(uint64_t owner) {
  auto owned = owned_keys_.find(owner);
  if (owned == owned_keys_.end()) return;
  const std::unordered_set<std::string> keys = std::move(owned->second);
  owned_keys_.erase(owned);
  for (const std::string& key : keys) {
    key_owner_.erase(key);
    // A key another client deleted since is gone already: nothing to release, nobody to tell.
    if (remove(key) && release_hook_) release_hook_(key);
  }
}

void KeyValueState::append(const std::string& key, std::string_view value) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    const SharedValue& now = store(key, std::string(value));
    written(key, WatchEvent::kKeyCreated, nullptr, now);
    return;
  }
  SharedValue old = old_for_watchers(key, it->second);
  if (it->second.use_count() == 1) {
    // Nobody else holds the buffer (no queued reply, no watcher's old value): grow it in place. It was made
    // non-const by make_shared_value, so this is allowed.
    const_cast<std::string&>(*it->second).append(value);
  } else {
    std::string grown;
    grown.reserve(it->second->size() + value.size());
    grown.append(*it->second).append(value);
    it->second = make_shared_value(std::move(grown));
  }
  stored_bytes_ += value.size();
  written(key, WatchEvent::kKeyUpdated, old, it->second);
}

void KeyValueState::queue_push(const std::string& key, std::string value) {
  auto& q = queues_[key];
  stored_bytes_ += value.size() + (q.empty() ? key.size() : 0);
  q.push_back(make_shared_value(std::move(value)));
  written(key, WatchEvent::kKeyUpdated, nullptr, q.back(), /*wake_one=*/true);
}

SharedValue KeyValueState::queue_pop(const std::string& key) {
  auto it = queues_.find(key);
  if (it == queues_.end()) return nullptr;
  SharedValue v = std::move(it->second.front());
  it->second.pop_front();
  stored_bytes_ -= v->size();
  if (it->second.empty()) {
    stored_bytes_ -= key.size();
    queues_.erase(it);
  }
  return v;
}

std::vector<std::string> KeyValueState::list_keys() const {
  return list_keys({});
}

int64_t KeyValueState::count_keys(std::string_view prefix) const {
  if (prefix.empty()) return num_keys();
  return std::count_if(values_.begin(), values_.end(),
                       [&](const auto& kv) { return kv.first.starts_with(prefix); });
}

std::vector<std::string> KeyValueState::list_keys(std::string_view prefix) const {
  std::vector<std::string> keys;
  if (prefix.empty()) keys.reserve(values_.size());
  for (const auto& [k, v] : values_) {
    if (k.starts_with(prefix)) keys.push_back(k);
  }
  return keys;
}

std::string KeyValueState::current_keyspace_prefix() const {
  const std::string* name = get(std::string(kWorkerKeyspaceKey));
  return name ? std::string(kAgentNamespace) + "ws/" + *name + "/" : std::string();
}

std::string KeyValueState::bind_keyspace() {
  std::string prefix = current_keyspace_prefix();
  if (!prefix.empty()) ++keyspace_refs_[prefix];
  return prefix;
}

void KeyValueState::unbind_keyspace(const std::string& prefix) {
  auto it = keyspace_refs_.find(prefix);
  if (it == keyspace_refs_.end() || it->second == 0) return;
  if (--it->second == 0) collect_keyspaces();
}

void KeyValueState::collect_keyspaces() {
  const std::string current = current_keyspace_prefix();
  for (auto it = keyspace_refs_.begin(); it != keyspace_refs_.end();) {
    if (it->second > 0 || it->first == current) {
      ++it;
      continue;
    }
    // Nobody bound to it can be waiting or watching: erase its data without notifications.
    const std::string& prefix = it->first;
    std::erase_if(values_, [&](const auto& kv) {
      if (!kv.first.starts_with(prefix)) return false;
      stored_bytes_ -= kv.first.size() + kv.second->size();
      return true;
    });
    std::erase_if(queues_, [&](const auto& kq) {
      if (!kq.first.starts_with(prefix)) return false;
      stored_bytes_ -= kq.first.size();
      for (const auto& v : kq.second) stored_bytes_ -= v->size();
      return true;
    });
    it = keyspace_refs_.erase(it);
  }
}

int64_t KeyValueState::queue_len(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

std::optional<KeyValueState::HandleId> KeyValueState::wait(const std::vector<std::string>& keys,
                                                           ReadyFn on_ready) {
  std::vector<std::string> missing;
  HandleId id = next_id_++;
  for (const auto& k : keys) {
    if (values_.count(k) || queues_.count(k)) continue;
    if (!waiters_by_key_[k].insert(id).second) continue;  // a key named twice counts once
    missing.push_back(k);
  }
  if (missing.empty()) return std::nullopt;
  const size_t count = missing.size();
  waiters_.emplace(id, Waiter{count, std::move(on_ready), std::move(missing)});
  return id;
}

bool KeyValueState::cancel_wait(HandleId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  // Drop its entries at once: a client that waits on keys nobody writes and cancels (or disconnects) must
  // not grow the index.
  for (const auto& k : it->second.keys) {
    auto by_key = waiters_by_key_.find(k);
    if (by_key == waiters_by_key_.end()) continue;  // already taken by written() for this key
    by_key->second.erase(id);
    if (by_key->second.empty()) waiters_by_key_.erase(by_key);
  }
  waiters_.erase(it);
  return true;
}

KeyValueState::HandleId KeyValueState::watch(const std::string& key, WatchFn fn) {
  HandleId id = next_id_++;
  watchers_.emplace(id, Watcher{key, std::move(fn)});
  watchers_by_key_[key].insert(id);
  return id;
}

void KeyValueState::unwatch(HandleId id) {
  auto it = watchers_.find(id);
  if (it == watchers_.end()) return;
  auto by_key = watchers_by_key_.find(it->second.key);
  if (by_key != watchers_by_key_.end()) {
    by_key->second.erase(id);
    if (by_key->second.empty()) watchers_by_key_.erase(by_key);
  }
  watchers_.erase(it);
}

void KeyValueState::written(const std::string& key, WatchEvent event, const SharedValue& old_value,
                            const SharedValue& new_value, bool wake_one) {
  if (key == kWorkerKeyspaceKey) collect_keyspaces();
  if (auto it = waiters_by_key_.find(key); it != waiters_by_key_.end()) {
    // Every waiter of the key counts this write (a queue push: only up to the first one it completes).
    std::vector<ReadyFn> ready;
    auto& ids = it->second;
    while (!ids.empty() && !(wake_one && !ready.empty())) {
      auto w = waiters_.find(*ids.begin());
      ids.erase(ids.begin());
      if (w != waiters_.end() && --w->second.missing == 0) {
        ready.push_back(std::move(w->second.on_ready));
        waiters_.erase(w);
      }
    }
    if (ids.empty()) waiters_by_key_.erase(it);
    for (auto& fn : ready) fn();
  }
  notify_watchers(key, event, old_value, new_value);
}

void KeyValueState::notify_watchers(const std::string& key, WatchEvent event, const SharedValue& old_value,
                                    const SharedValue& new_value) {
  auto it = watchers_by_key_.find(key);
  if (it == watchers_by_key_.end()) return;
  std::vector<HandleId> ids(it->second.begin(), it->second.end());  // a callback may unwatch
  for (HandleId id : ids) {
    auto w = watchers_.find(id);
    if (w != watchers_.end()) w->second.fn(event, key, old_value, new_value);
  }
}

}  // namespace ddprun::rdzv
