#include "rendezvous/key_value_state.h"

#include <algorithm>
#include <charconv>

namespace ddprun::rdzv {
namespace {

std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  const char* begin = s.data();
  const char* end = s.data() + s.size();
  if (begin != end && *begin == '+') ++begin;
  auto [p, ec] = std::from_chars(begin, end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

}  // namespace

void KeyValueState::store(const std::string& key, std::string value) {
  auto [it, inserted] = values_.try_emplace(key);
  if (inserted) {
    stored_bytes_ += key.size();
  } else {
    stored_bytes_ -= it->second.size();
  }
  stored_bytes_ += value.size();
  it->second = std::move(value);
}

void KeyValueState::set(const std::string& key, std::string value) {
  auto it = values_.find(key);
  std::optional<std::string> old;
  if (it != values_.end() && watchers_by_key_.count(key)) old = it->second;
  bool existed = it != values_.end();
  store(key, std::move(value));
  written(key, existed ? WatchEvent::kKeyUpdated : WatchEvent::kKeyCreated, old ? &*old : nullptr,
          &values_.at(key));
}

const std::string* KeyValueState::get(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::optional<int64_t> KeyValueState::add(const std::string& key, int64_t delta) {
  auto it = values_.find(key);
  int64_t current = 0;
  bool existed = it != values_.end();
  std::optional<std::string> old;
  if (existed) {
    auto parsed = parse_int(it->second);
    if (!parsed) return std::nullopt;
    current = *parsed;
    if (watchers_by_key_.count(key)) old = it->second;
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) return std::nullopt;
  store(key, std::to_string(result));
  written(key, existed ? WatchEvent::kKeyUpdated : WatchEvent::kKeyCreated, old ? &*old : nullptr,
          &values_.at(key));
  return result;
}

std::string KeyValueState::compare_set(const std::string& key, const std::string& expected,
                                       std::string desired) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    if (!expected.empty()) return expected;
    store(key, std::move(desired));
    const std::string& now = values_.at(key);
    written(key, WatchEvent::kKeyCreated, nullptr, &now);
    return now;
  }
  if (it->second == expected) {
    std::string old = it->second;  // a copy: store() subtracts the old value's size from stored_bytes_
    store(key, std::move(desired));
    const std::string& now = values_.at(key);
    written(key, WatchEvent::kKeyUpdated, &old, &now);
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
  std::string old = std::move(it->second);
  stored_bytes_ -= key.size() + old.size();
  values_.erase(it);
  deleted(key, old);
  return true;
}

void KeyValueState::append(const std::string& key, std::string_view value) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    store(key, std::string(value));
    written(key, WatchEvent::kKeyCreated, nullptr, &values_.at(key));
    return;
  }
  std::optional<std::string> old;
  if (watchers_by_key_.count(key)) old = it->second;
  it->second.append(value);
  stored_bytes_ += value.size();
  written(key, WatchEvent::kKeyUpdated, old ? &*old : nullptr, &it->second);
}

void KeyValueState::queue_push(const std::string& key, std::string value) {
  auto& q = queues_[key];
  stored_bytes_ += value.size() + (q.empty() ? key.size() : 0);
  q.push_back(std::move(value));
  written(key, WatchEvent::kKeyUpdated, nullptr, &q.back(), /*wake_one=*/true);
}

std::optional<std::string> KeyValueState::queue_pop(const std::string& key) {
  auto it = queues_.find(key);
  if (it == queues_.end()) return std::nullopt;
  std::string v = std::move(it->second.front());
  it->second.pop_front();
  stored_bytes_ -= v.size();
  if (it->second.empty()) {
    stored_bytes_ -= key.size();
    queues_.erase(it);
  }
  return v;
}

std::vector<std::string> KeyValueState::list_keys() const { return list_keys({}); }

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
      stored_bytes_ -= kv.first.size() + kv.second.size();
      return true;
    });
    std::erase_if(queues_, [&](const auto& kq) {
      if (!kq.first.starts_with(prefix)) return false;
      stored_bytes_ -= kq.first.size();
      for (const auto& v : kq.second) stored_bytes_ -= v.size();
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

void KeyValueState::written(const std::string& key, WatchEvent event, const std::string* old_value,
                            const std::string* new_value, bool wake_one) {
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

void KeyValueState::deleted(const std::string& key, const std::string& old_value) {
  notify_watchers(key, WatchEvent::kKeyDeleted, &old_value, nullptr);
}

void KeyValueState::notify_watchers(const std::string& key, WatchEvent event, const std::string* old_value,
                                    const std::string* new_value) {
  auto it = watchers_by_key_.find(key);
  if (it == watchers_by_key_.end()) return;
  std::vector<HandleId> ids(it->second.begin(), it->second.end());  // a callback may unwatch
  for (HandleId id : ids) {
    auto w = watchers_.find(id);
    if (w != watchers_.end()) w->second.fn(event, key, old_value, new_value);
  }
}

}  // namespace ddprun::rdzv
