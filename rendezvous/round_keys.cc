#include "rendezvous/round_keys.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <unordered_set>

#include "rendezvous/store/key_value_state.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

namespace {

void check_present(Store& store, const std::vector<std::string>& keys, size_t begin, size_t end,
                   std::vector<bool>& out) {
  if (begin == end) return;
  if (store.check(std::vector<std::string>(keys.begin() + begin, keys.begin() + end))) {
    std::fill(out.begin() + begin, out.begin() + end, true);
  } else if (end - begin > 1) {
    const size_t mid = begin + (end - begin) / 2;
    check_present(store, keys, begin, mid, out);
    check_present(store, keys, mid, end, out);
  }
}

}  // namespace

std::vector<bool> keys_present(Store& store, const std::vector<std::string>& keys) {
  std::vector<bool> out(keys.size(), false);
  check_present(store, keys, 0, keys.size(), out);
  return out;
}

// ---- RoundStop encoding: "<kind>|<node_rank>|<exit_code>|<detail>" ----------------------------------------

std::string encode_round_stop(const RoundStop& stop) {
  const char* kind = stop.kind == RoundStop::Kind::kDone       ? "done"
                     : stop.kind == RoundStop::Kind::kFailed   ? "failed"
                     : stop.kind == RoundStop::Kind::kShutdown ? "shutdown"
                                                               : "membership";
  return std::string(kind) + "|" + std::to_string(stop.node_rank) + "|" + std::to_string(stop.exit_code) +
         "|" + stop.detail;
}

std::optional<RoundStop> decode_round_stop(std::string_view text) {
  RoundStop s;
  auto next = [&](std::string_view& field) {
    auto bar = text.find('|');
    if (bar == std::string_view::npos) return false;
    field = text.substr(0, bar);
    text.remove_prefix(bar + 1);
    return true;
  };
  std::string_view kind, node, code;
  if (!next(kind) || !next(node) || !next(code)) return std::nullopt;
  if (kind == "done") {
    s.kind = RoundStop::Kind::kDone;
  } else if (kind == "failed") {
    s.kind = RoundStop::Kind::kFailed;
  } else if (kind == "shutdown") {
    s.kind = RoundStop::Kind::kShutdown;
  } else if (kind == "membership") {
    s.kind = RoundStop::Kind::kMembership;
  } else {
    return std::nullopt;
  }
  // Plain decimal only, as encode writes it: no sign "+", no leading zeros, no spaces, nothing after it.
  auto canonical_int = [](std::string_view field) -> std::optional<int> {
    auto v = parse_int(field);
    if (!v || *v < INT32_MIN || *v > INT32_MAX || std::to_string(*v) != field) return std::nullopt;
    return static_cast<int>(*v);
  };
  auto node_rank = canonical_int(node), exit_code = canonical_int(code);
  if (!node_rank || !exit_code) return std::nullopt;
  s.node_rank = *node_rank;
  s.exit_code = *exit_code;
  s.detail = std::string(text);
  return s;
}

namespace {

RoundStop decode_stored_stop(const std::string& text, int round) {
  auto decoded = decode_round_stop(text);
  if (!decoded) {
    throw BadReplyError("the store holds an unreadable stop of round " + std::to_string(round) + ": '" +
                        text + "'");
  }
  return *decoded;
}

}  // namespace

RoundStop RoundKeys::stop(Store& store, int round, const RoundStop& stop) const {
  return decode_stored_stop(store.compare_set(round_key(round, "stop"), "", encode_round_stop(stop)), round);
}

std::optional<RoundStop> RoundKeys::wait_stopped(Store& store, int round,
                                                 std::chrono::milliseconds timeout) const {
  const std::string k = round_key(round, "stop");
  try {
    store.wait({k}, timeout);
  } catch (const WaitTimeoutError&) {  // not stopped yet (a store that does not answer is an error)
    return std::nullopt;
  }
  return stopped(store, round);
}

RoundStop RoundKeys::stopped(Store& store, int round) const {
  return decode_stored_stop(store.get(round_key(round, "stop")), round);
}

void RoundKeys::open_worker_keyspace(Store& store, int round) const {
  // The client adds the leading "/" of the wire key.
  store.set(std::string(KeyValueState::kWorkerKeyspaceKey.substr(1)), run_id_ + "/r" + std::to_string(round));
}

void RoundKeys::done(Store& store, int round, int nodes, int node_rank) const {
  if (store.add(round_key(round, "done"), 1) == nodes) {
    stop(store, round, RoundStop{RoundStop::Kind::kDone, node_rank, "all nodes succeeded", 0});
  }
}

void RoundKeys::publish_status(Store& store, const std::string& identity, const std::string& doc,
                               bool& registered) const {
  store.set(key("status/" + identity), doc);
  if (registered) return;
  const int64_t n = store.add(key("status/n"), 1);
  store.set(key("status/" + std::to_string(n - 1)), identity);
  registered = true;
}

std::vector<RoundKeys::StatusSlot> RoundKeys::status_slots(Store& store) const {
  const std::string count_key = key("status/n");
  const int64_t n = store.check({count_key}) ? store.add(count_key, 0) : 0;
  std::vector<std::string> index_keys;
  for (int64_t i = 0; i < n && i < kMaxStatusSlots; ++i)
    index_keys.push_back(key("status/" + std::to_string(i)));
  // A slot is missing between an agent's ADD and its SET (or forever, when a stranger only ADDed): a
  // MULTI_GET would wait for it.
  const std::vector<bool> present = keys_present(store, index_keys);
  std::vector<std::string> there;
  for (size_t i = 0; i < index_keys.size(); ++i) {
    if (present[i]) there.push_back(index_keys[i]);
  }
  const std::vector<std::string> names = there.empty() ? std::vector<std::string>{} : store.multi_get(there);
  // An agent registers again on a standby store that took over the keys of the lost one: once is enough. An
  // emptied slot (prune_status) names nobody.
  std::vector<StatusSlot> slots;
  std::unordered_set<std::string> seen;
  for (size_t i = 0, j = 0; i < index_keys.size() && j < names.size(); ++i) {
    if (!present[i]) continue;
    const std::string& id = names[j++];
    if (!id.empty() && seen.insert(id).second) slots.push_back({static_cast<int64_t>(i), id});
  }
  return slots;
}

std::vector<std::string> RoundKeys::status_identities(Store& store) const {
  std::vector<std::string> identities;
  for (StatusSlot& s : status_slots(store)) identities.push_back(std::move(s.identity));
  return identities;
}

void RoundKeys::prune_status(Store& store, const StatusSlot& slot) const {
  store.delete_key(key("status/" + slot.identity));
  store.compare_set(key("status/" + std::to_string(slot.index)), slot.identity, "");
}

std::vector<std::string> RoundKeys::status_documents(Store& store,
                                                     const std::vector<std::string>& identities) const {
  std::vector<std::string> doc_keys;
  for (const auto& id : identities) doc_keys.push_back(key("status/" + id));
  const std::vector<bool> present = keys_present(store, doc_keys);
  std::vector<std::string> there;
  for (size_t i = 0; i < doc_keys.size(); ++i) {
    if (present[i]) there.push_back(doc_keys[i]);
  }
  std::vector<std::string> read = there.empty() ? std::vector<std::string>{} : store.multi_get(there);
  std::vector<std::string> docs(identities.size());
  for (size_t i = 0, j = 0; i < docs.size() && j < read.size(); ++i) {
    if (present[i]) docs[i] = std::move(read[j++]);
  }
  return docs;
}

std::optional<std::string> RoundKeys::stragglers(Store& store) const {
  const std::string k = key("status/stragglers");
  if (!store.check({k})) return std::nullopt;
  return store.get(k);
}

void RoundKeys::leave(Store& store, int round, int nodes, bool wait) const {
  if (round < 0 || nodes <= 0) return;
  try {
    if (store.add(round_key(round, "left"), 1) == nodes) store.set(round_key(round, "left_all"), "1");
    if (wait) store.wait({round_key(round, "left_all")}, std::chrono::seconds(10));
  } catch (const StoreError& e) {
    spdlog::debug("rendezvous {}: leaving round {}: {}", run_id_, round, e.what());
  }
}

}  // namespace ddprun::rdzv
