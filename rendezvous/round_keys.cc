#include "rendezvous/round_keys.h"

#include <spdlog/spdlog.h>

#include "rendezvous/key_value_state.h"

namespace ddprun::rdzv {

RoundStop RoundKeys::stop(Store& store, int round, const RoundStop& stop) const {
  std::string now = store.compare_set(round_key(round, "stop"), "", encode_round_stop(stop));
  auto decoded = decode_round_stop(now);
  if (!decoded) throw BadReplyError("rendezvous '" + run_id_ + "': unreadable round stop '" + now + "'");
  return *decoded;
}

std::optional<RoundStop> RoundKeys::wait_stopped(Store& store, int round, std::chrono::milliseconds timeout) const {
  const std::string k = round_key(round, "stop");
  try {
    store.wait({k}, timeout);
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
  return decode_round_stop(store.get(k));
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
