#include "rendezvous/etcd/etcd_store.h"

#include <algorithm>
#include <boost/beast/core/detail/base64.hpp>
#include <map>
#include <random>
#include <thread>

#include "rendezvous/util/backoff.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv::etcd {

namespace b64 = boost::beast::detail::base64;
using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

std::string base64_encode(std::string_view bytes) {
  std::string out(b64::encoded_size(bytes.size()), '\0');
  out.resize(b64::encode(out.data(), bytes.data(), bytes.size()));
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  const size_t pad = text.size() - std::min(text.find_last_not_of('='), text.size() - 1) - 1;
  if (pad > 2) return std::nullopt;
  const std::string_view body = text.substr(0, text.size() - pad);
  std::string out(b64::decoded_size(text.size()), '\0');
  auto [written, read] = b64::decode(out.data(), body.data(), body.size());
  if (read != body.size()) return std::nullopt;  // a byte that is not base64
  out.resize(written);
  return out;
}

namespace {

bool is(const EtcdKeyError& e, int code) {
  return e.code() == code;
}

}  // namespace

struct EtcdStore::Listing {
  std::map<std::string, std::string> values;  // etcd path -> raw (base64) value, every leaf under the prefix
  uint64_t index = 0;                         // watch from index + 1
};

EtcdStore::EtcdStore(std::shared_ptr<Client> client, std::string prefix, milliseconds timeout)
    : Store(timeout), client_(std::move(client)), prefix_(std::move(prefix)) {
  if (prefix_.empty() || prefix_.front() != '/') prefix_.insert(prefix_.begin(), '/');
  if (prefix_.back() != '/') prefix_ += '/';
}

std::string EtcdStore::path(std::string_view key) const {
  return prefix_ + base64_encode(key);
}

std::string EtcdStore::decode_value(const Node& node) const {
  auto v = base64_decode(node.value);
  if (!v) {
    throw BadReplyError(
        "etcd key " + node.key + " at " + client_->current_endpoint() + " holds '" + printable(node.value) +
        "', not the base64 value a torch or ddprun agent writes: does another program use this "
        "prefix (" +
        prefix_ + ")?");
  }
  return *v;
}

EtcdStore::Listing EtcdStore::list() {
  Listing out;
  try {
    Response r = client_->get(prefix_, GetOptions{.recursive = true});
    out.index = r.etcd_index;
    std::vector<const Node*> todo{&r.node};
    while (!todo.empty()) {
      const Node* n = todo.back();
      todo.pop_back();
      if (!n->dir) out.values[n->key] = n->value;
      for (const Node& c : n->nodes) todo.push_back(&c);
    }
  } catch (const EtcdKeyError& e) {
    if (!is(e, kKeyNotFound)) throw;
    out.index = e.index();
  }
  return out;
}

void EtcdStore::set(std::string_view key, std::string_view value) {
  client_->write(path(key), base64_encode(value));
}

std::string EtcdStore::get(std::string_view key) {
  return get_within(key, timeout());
}

std::string EtcdStore::get_within(std::string_view key, milliseconds timeout) {
  const std::string p = path(key);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    uint64_t index = 0;
    try {
      return decode_value(client_->get(p).node);
    } catch (const EtcdKeyError& e) {
      if (!is(e, kKeyNotFound)) throw;
      index = e.index();
    }
    const auto left = duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw WaitTimeoutError("etcd key " + p + " ('" + printable(key) + "') at " +
                             client_->current_endpoint() + " was not set within " +
                             std::to_string(timeout.count()) + " ms");
    }
    try {
      client_->watch(p, index + 1, false, left);
    } catch (const EtcdKeyError& e) {
      if (!is(e, kEventIndexCleared)) throw;
    }
  }
}

std::vector<EtcdStore::Found> EtcdStore::wait_any(const std::vector<std::vector<std::string>>& groups,
                                                  milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    Listing l = list();
    std::vector<Found> found;
    for (const auto& group : groups) {
      auto first = std::find_if(group.begin(), group.end(),
                                [&](const std::string& k) { return l.values.count(path(k)); });
      if (first == group.end()) break;  // this group has none yet
      const std::string& etcd_key = path(*first);
      found.push_back(Found{static_cast<size_t>(first - group.begin()),
                            decode_value(Node{.key = etcd_key, .value = l.values.at(etcd_key)})});
    }
    if (found.size() == groups.size()) return found;
    const auto left = duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      std::string missing;
      for (const auto& group : groups) {
        bool any = false;
        for (const auto& k : group) any = any || l.values.count(path(k)) > 0;
        if (!any) missing += (missing.empty() ? "" : ", ") + printable(group.front());
      }
      throw WaitTimeoutError("etcd keys under " + prefix_ + " at " + client_->current_endpoint() +
                             " were not all set within " + std::to_string(timeout.count()) +
                             " ms; missing: " + missing);
    }
    try {
      client_->watch(prefix_, l.index + 1, true, left);
    } catch (const EtcdKeyError& e) {
      if (!is(e, kEventIndexCleared)) throw;
    }
  }
}

int64_t EtcdStore::add(std::string_view key, int64_t delta) {
  const std::string p = path(key);
  auto number = [&](const Node& n) {
    const std::string text = decode_value(n);
    auto v = parse_int(text);
    if (!v) {
      throw BadReplyError("etcd key " + p + " ('" + printable(key) + "') at " + client_->current_endpoint() +
                          " holds '" + printable(text) + "', not a counter");
    }
    return *v;
  };
  while (true) {
    try {
      return number(client_->write(p, base64_encode(std::to_string(delta)), {.prev_exist = false}).node);
    } catch (const EtcdKeyError& e) {
      if (!is(e, kNodeExist)) throw;
    }
    while (true) {
      Node current;
      try {
        current = client_->get(p).node;
      } catch (const EtcdKeyError& e) {
        if (!is(e, kKeyNotFound)) throw;
        break;  // deleted meanwhile: create it again
      }
      const int64_t next = number(current) + delta;
      try {
        client_->write(p, base64_encode(std::to_string(next)), {.prev_value = current.value});
        return next;
      } catch (const EtcdKeyError& e) {
        if (!is(e, kTestFailed) && !is(e, kKeyNotFound)) throw;
      }
      retry_backoff();
    }
  }
}

std::string EtcdStore::compare_set(std::string_view key, std::string_view expected,
                                   std::string_view desired) {
  const std::string p = path(key);
  while (true) {
    try {
      if (expected.empty()) {
        client_->write(p, base64_encode(desired), {.prev_exist = false});
      } else {
        client_->write(p, base64_encode(desired), {.prev_value = base64_encode(expected)});
      }
      return std::string(desired);
    } catch (const EtcdKeyError& e) {
      if (e.code() == kKeyNotFound) return std::string(expected);
      if (!is(e, kNodeExist) && !is(e, kTestFailed)) throw;
    }
    try {
      return decode_value(client_->get(p).node);
    } catch (const EtcdKeyError& e) {
      if (!is(e, kKeyNotFound)) throw;  // deleted between the two requests: try again
    }
  }
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  if (keys.size() == 1) {  // one key: read it, not the whole run's keyspace
    try {
      client_->get(path(keys.front()));
      return true;
    } catch (const EtcdKeyError& e) {
      if (!is(e, kKeyNotFound)) throw;
      return false;
    }
  }
  Listing l = list();
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& k) { return l.values.count(path(k)) > 0; });
}

void EtcdStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  (void)multi_get_within(keys, timeout);
}

bool EtcdStore::delete_key(std::string_view key) {
  try {
    client_->remove(path(key));
    return true;
  } catch (const EtcdKeyError& e) {
    if (!is(e, kKeyNotFound)) throw;
    return false;
  }
}

int64_t EtcdStore::num_keys() {
  return static_cast<int64_t>(list().values.size());
}

void EtcdStore::append(std::string_view key, std::string_view value) {
  const std::string p = path(key);
  while (true) {
    try {
      client_->write(p, base64_encode(value), {.prev_exist = false});
      return;
    } catch (const EtcdKeyError& e) {
      if (!is(e, kNodeExist)) throw;
    }
    try {
      const Node current = client_->get(p).node;
      client_->write(p, base64_encode(decode_value(current) + std::string(value)),
                     {.prev_value = current.value});
      return;
    } catch (const EtcdKeyError& e) {
      if (!is(e, kTestFailed) && !is(e, kKeyNotFound)) throw;
    }
    retry_backoff();
  }
}

std::vector<std::string> EtcdStore::multi_get(const std::vector<std::string>& keys) {
  return multi_get_within(keys, timeout());
}

std::vector<std::string> EtcdStore::multi_get_within(const std::vector<std::string>& keys,
                                                     milliseconds timeout) {
  // One key: read it and watch only it (a listing would return, and every write under the prefix would wake,
  // the whole keyspace of the run).
  if (keys.size() == 1) return {get_within(keys.front(), timeout)};
  std::vector<std::vector<std::string>> groups;
  groups.reserve(keys.size());
  for (const auto& k : keys) groups.push_back({k});
  std::vector<std::string> out;
  for (Found& f : wait_any(groups, timeout)) out.push_back(std::move(f.value));
  return out;
}

void EtcdStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size())
    throw InvalidArgumentError("EtcdStore::multi_set: keys and values differ in number");
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace ddprun::rdzv::etcd
