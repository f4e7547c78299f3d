// DynamicRendezvous (rendezvous/c10d/dynamic_rendezvous.h): how a round completes — who closes it and when, which
// arrivals take part, their ranks, and what a node reads back.
//
// When: a round closes as soon as it can be known complete, never after a fixed wait. The closer (the node
// whose arrival makes the count MIN) closes it when
//   - every member of the previous round that is still alive has joined (a restart, or a re-form after a node
//     was lost: the survivors are all back), or MAX nodes joined with no living member missing, or
//   - after a failover, every node expected to survive joined (r<r>/full), or
//   - the last call ends (last_call_timeout after the closer arrived): the first round with MIN < MAX, or a
//     living member that does not come back.
// A member of the previous round is gone when its connection-bound key live/<identity> is gone (its agent's
// connection to the store closed: the process died; KeyValueState::connection_bound), when a neighbour
// declared it lost (r<r-1>/lost/<node rank>: it stopped heart-beating), or when its heartbeat counter of the
// previous round stays still for the heartbeat timeout while the closer watches (a host that vanished without
// closing its connections). An external store (etcd) has no connection-bound keys: only the last two apply.
//
// Which: at most MAX arrivals take part, the previous round's members first, then the others in arrival order
// (select_nodes); the rest are told "spare" and wait for the round to end. Ranks: order_nodes (survivors keep
// theirs, spares take the freed ones). The closer also lists the previous round's members that are not in
// this one (r<r>/dropped), but not those that stood aside (r<r-1>/aside/<rank>): their agents charge the
// restart that their loss caused to that loss.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "rendezvous/c10d/c10d_round.h"
#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

namespace {

constexpr char kSpare[] = "spare";

}  // namespace

void DynamicRendezvous::announce_alive() {
  if (!external()) store_->set(key("live/" + options_.identity), "1");
}

int64_t DynamicRendezvous::wait_closed_or_close(int r, int64_t index) {
  const std::string closed = round_key(r, "closed");
  if (index + 1 == options_.min_nodes) {
    close_when_ready(r);
  } else {
    const auto start = Clock::now();
    const auto deadline = start + options_.join_timeout;
    int64_t k = index + 1;  // nodes known to have joined
    while (true) {
      try {
        auto count = wait_or_count(closed, round_key(r, "joined"), deadline, options_.progress_interval);
        if (!count) break;
        k = *count;
      } catch (const ConnectionLostError& e) {
        if (failover_on() && !successors_.empty()) throw;  // lost after a round: next_rendezvous fails over
        // Only the store host's agent can take the store away before the round completes: it gave up waiting
        // (its join timeout, usually a little ahead of ours) or was stopped. Report the timeout, not the
        // socket.
        throw RendezvousTimeoutError(
            "rendezvous '" + run_id() + "' round " + std::to_string(r) + ": the store at " + endpoint() +
            " went away while this node waited for at least " + std::to_string(options_.min_nodes) +
            " nodes (" + std::to_string(k) +
            " had joined): the agent hosting it gave up, most likely at its join timeout (" +
            duration_text(options_.join_timeout) +
            " here). Start every node within join_timeout of the first, with the same --rdzv_endpoint and "
            "--rdzv_id, or lower --nnodes MIN (" +
            e.what() + ")");
      }
      if (Clock::now() >= deadline) throw too_few_nodes(r, k);
      if (k >= options_.min_nodes &&
          Clock::now() - start > options_.last_call_timeout + options_.close_timeout) {
        spdlog::warn("rendezvous {} round {}: the node running the last call vanished; closing the round",
                     run_id(), r);
        close_round(r, k);
        continue;
      }
      spdlog::info("rendezvous {} round {}: {}/{} joined (max {}), waiting for {} at {}", run_id(), r, k,
                   options_.min_nodes, options_.max_nodes,
                   k < options_.min_nodes ? "more nodes" : "the round to close", endpoint());
    }
  }
  return read_int(store_->get(closed), "arrivals of round " + std::to_string(r), 1);
}

std::vector<std::string> DynamicRendezvous::members_of(Store& store, int r) const {
  if (r < 0 || !store.check({round_key(r, "members")})) return {};
  return decode_identities(store.get(round_key(r, "members")));
}

void DynamicRendezvous::drop_gone(int r, std::map<std::string, int>& missing, LivenessWatch& watch) {
  if (missing.empty()) return;
  const auto now = Clock::now();
  std::vector<std::string> gone;
  // Connection-bound keys (own store; after a failover the new store holds none yet): one CHECK while
  // every missing member is there, one per member otherwise.
  if (!external() && expected_nodes_ == 0) {
    std::vector<std::string> live;
    for (const auto& [id, rank] : missing) live.push_back(key("live/" + id));
    if (!store_->check(live)) {
      for (const auto& [id, rank] : missing) {
        if (!store_->check({key("live/" + id)})) gone.push_back(id);
      }
    }
  }
  // Marks and heartbeats: a request per member, so every poll only on an external store (no live keys,
  // small jobs), else once per heartbeat interval (a host gone without closing its connections).
  if (external() || expected_nodes_ > 0 || now >= watch.next_heartbeat_check) {
    watch.next_heartbeat_check = now + options_.keep_alive_interval;
    for (const auto& [id, rank] : missing) {
      const std::string rk = std::to_string(rank);
      if (store_->check({round_key(r - 1, "lost/" + rk)})) {
        gone.push_back(id);
        continue;
      }
      const int64_t n = store_->add(round_key(r - 1, "hb/" + rk), 0);
      auto [it, fresh] = watch.beats.try_emplace(rank, n, now);
      if (fresh || it->second.first != n) {
        it->second = {n, now};
      } else if (now - it->second.second > heartbeat_timeout()) {
        gone.push_back(id);
      }
    }
  }
  for (const auto& id : gone) missing.erase(id);
}

void DynamicRendezvous::close_when_ready(int r) {
  const int min = options_.min_nodes, max = options_.max_nodes;
  const std::vector<std::string> members = members_of(*store_, r - 1);
  if (members.empty()) {  // the first round, or nothing known of the previous one: torchrun's last call
    if (max > min) {
      spdlog::info("rendezvous {} round {}: {} nodes joined (min {}), last call for up to {} more for {}",
                   run_id(), r, min, min, max - min, duration_text(options_.last_call_timeout));
      try {
        store_->wait({round_key(r, "full")}, options_.last_call_timeout);
      } catch (const WaitTimeoutError&) {  // the last call is over
      }
    }
    close_round(r, store_->add(round_key(r, "joined"), 0));
    return;
  }
  // A restart or a re-form: the round is complete once every living member of the previous one is back.
  const auto last_call_end = Clock::now() + options_.last_call_timeout;
  std::map<std::string, int> missing;  // identity -> rank in the previous round
  for (size_t m = 0; m < members.size(); ++m) missing.emplace(members[m], static_cast<int>(m));
  LivenessWatch watch;
  int64_t seen = 0;  // arrivals whose descriptors were read
  while (true) {
    const int64_t k = store_->add(round_key(r, "joined"), 0);
    if (k > seen) {
      std::vector<std::string> node_keys;
      for (int64_t i = seen; i < k; ++i) node_keys.push_back(round_key(r, "node/" + std::to_string(i)));
      for (const auto& d : store_->multi_get(node_keys)) missing.erase(identity_of(d));
      seen = k;
    }
    drop_gone(r, missing, watch);
    const bool after_failover = expected_nodes_ > 0 && store_->check({round_key(r, "full")});
    if (missing.empty() || after_failover || Clock::now() >= last_call_end) {
      if (!missing.empty() && !after_failover) {
        spdlog::warn(
            "rendezvous {} round {}: {} node(s) of the previous round still alive did not join "
            "within the last call ({}); closing without them",
            run_id(), r, missing.size(), duration_text(options_.last_call_timeout));
      }
      // Every arrival up to now takes part or waits as a spare: one that came after `k` was read (it may
      // have set r<r>/full) must not find the round closed without it.
      close_round(r, store_->add(round_key(r, "joined"), 0));
      return;
    }
    // The next arrival, or 100 ms: a member's agent may die meanwhile, and only a read tells.
    const auto left = std::min(duration_cast<milliseconds>(last_call_end - Clock::now()), milliseconds(100));
    try {
      store_->wait({round_key(r, "node/" + std::to_string(k))}, std::max(left, milliseconds(1)));
    } catch (const WaitTimeoutError&) {
    }
  }
}

bool DynamicRendezvous::spare_waiting() {
  const int r = round_.load();
  if (external()) return false;
  const std::vector<std::string> members = members_of(*store_, r);
  if (members.empty()) return false;
  const int64_t arrivals = store_->add(round_key(r, "joined"), 0);
  std::vector<std::string> node_keys;
  for (int64_t i = 0; i < arrivals; ++i) node_keys.push_back(round_key(r, "node/" + std::to_string(i)));
  for (const auto& d : store_->multi_get(node_keys)) {
    const std::string id = identity_of(d);
    if (std::find(members.begin(), members.end(), id) == members.end() &&
        store_->check({key("live/" + id)})) {
      return true;
    }
  }
  return false;
}

std::vector<int> DynamicRendezvous::do_lost_nodes() {
  const int r = round_.load();
  if (nodes_ <= 1 || external()) return {};
  const std::vector<std::string> members = members_of(*store_, r);
  std::vector<std::string> live;
  for (const auto& m : members) live.push_back(key("live/" + m));
  if (store_->check(live)) return {};  // one request when everyone is there
  std::vector<int> lost;
  for (size_t i = 0; i < live.size(); ++i) {
    if (static_cast<int>(i) != rank_ && !store_->check({live[i]})) lost.push_back(static_cast<int>(i));
  }
  // Every other node gone at once: perhaps this store host was frozen and they moved on (stop_round says so).
  if (!lost.empty()) job_moved();
  return lost;
}

void DynamicRendezvous::close_round(int r, int64_t arrivals) {
  const std::string won = store_->compare_set(round_key(r, "closed"), "", std::to_string(arrivals));
  if (won == std::to_string(arrivals)) assign_ranks(r, arrivals);  // else someone else closed it
}

void DynamicRendezvous::assign_ranks(int r, int64_t arrivals) {
  // This node closed the round: it alone reads the descriptors and assigns every node its rank.
  std::vector<std::string> node_keys;
  for (int64_t i = 0; i < arrivals; ++i) node_keys.push_back(round_key(r, "node/" + std::to_string(i)));
  std::vector<NodeDescriptor> all;
  for (const auto& text : store_->multi_get(node_keys)) {
    UnreadableField why;
    auto d = decode_node_descriptor(text, why);
    if (!d) throw unreadable(why.what, why.text);
    all.push_back(std::move(*d));
  }
  const std::vector<std::string> members = members_of(*store_, r - 1);
  std::vector<bool> member;
  for (NodeDescriptor& d : all) {
    member.push_back(std::find(members.begin(), members.end(), d.identity) != members.end());
    if (!member.back()) d.previous_rank = -1;  // a rank from an older round is not kept
  }
  const std::vector<size_t> chosen = select_nodes(member, options_.max_nodes);
  std::vector<NodeDescriptor> nodes;
  for (size_t i : chosen) nodes.push_back(all[i]);
  const std::vector<RankAssignment> assignments = rdzv::assign_ranks(nodes);

  std::vector<std::string> by_rank(nodes.size()), dropped;
  for (size_t j = 0; j < nodes.size(); ++j)
    by_rank[static_cast<size_t>(assignments[j].node_rank)] = nodes[j].identity;
  for (size_t k = 0; k < members.size(); ++k) {
    // A member that stood aside (sat out, unhealthy: step_aside) is not lost: the restart it missed stays
    // counted.
    if (std::find(by_rank.begin(), by_rank.end(), members[k]) == by_rank.end() &&
        !store_->check({round_key(r - 1, "aside/" + std::to_string(k))}))
      dropped.push_back(members[k]);
  }
  // Written before the assignments: a node that reads its assignment finds these.
  std::vector<std::string> keys{round_key(r, "members"), round_key(r, "dropped")};
  std::vector<std::string> values{encode_identities(by_rank), encode_identities(dropped)};
  for (size_t i = 0, j = 0; i < all.size(); ++i) {
    keys.push_back(round_key(r, "assign/" + std::to_string(i)));
    const bool in = j < chosen.size() && chosen[j] == i;
    values.push_back(in ? encode(assignments[j++]) : kSpare);
  }
  if (!external()) keys_.open_worker_keyspace(*store_, r);
  store_->multi_set(keys, values);
  store_->set(key("round"), std::to_string(r));
  const size_t spares = all.size() - nodes.size();
  spdlog::info(
      "rendezvous {} round {}: closed with {} nodes ({} workers){}{}", run_id(), r, nodes.size(),
      assignments.front().world_size,
      spares ? ", " + std::to_string(spares) + " spare(s) waiting" : std::string(),
      dropped.empty() ? std::string() : "; not back from the previous round: " + encode_identities(dropped));
}

RendezvousTimeoutError DynamicRendezvous::too_few_nodes(int r, int64_t joined) const {
  std::string names;
  const int64_t shown = std::min<int64_t>(joined, 16);
  std::vector<std::string> node_keys;
  for (int64_t i = 0; i < shown; ++i) node_keys.push_back(round_key(r, "node/" + std::to_string(i)));
  for (const auto& d : store_->multi_get(node_keys)) names += (names.empty() ? "" : ", ") + identity_of(d);
  if (joined > shown) names += ", ...";
  return RendezvousTimeoutError(
      "rendezvous '" + run_id() + "' round " + std::to_string(r) + ": only " + std::to_string(joined) +
      " of at least " + std::to_string(options_.min_nodes) + " nodes joined within " +
      duration_text(options_.join_timeout) + " at " + endpoint() + " (joined: " + names +
      "). Start more nodes with the same --rdzv_endpoint and --rdzv_id, or lower "
      "--nnodes MIN");
}

std::optional<RendezvousInfo> DynamicRendezvous::await_assignment(int r, int64_t index,
                                                                  Clock::time_point deadline) {
  const std::string assign = round_key(r, "assign/" + std::to_string(index));
  try {
    store_->wait({assign}, options_.close_timeout);
  } catch (const WaitTimeoutError&) {
    spdlog::warn("rendezvous {} round {}: no rank assignment within {}; starting a new round", run_id(), r,
                 duration_text(options_.close_timeout));
    keys_.stop(*store_, r, RoundStop{RoundStop::Kind::kMembership, -1, "closer vanished", 0});
    return std::nullopt;
  }
  const std::string text = store_->get(assign);
  if (text == kSpare) {
    spdlog::info("rendezvous {} round {}: {} nodes take part; this node waits as a spare", run_id(), r,
                 options_.max_nodes);
    after_close(r, options_.max_nodes, deadline);
    return std::nullopt;
  }
  UnreadableField why;
  auto assignment = decode_rank_assignment(text, why);
  if (!assignment) throw unreadable(why.what, why.text);
  RendezvousInfo info;
  info.round = r;
  info.group_rank = assignment->node_rank;
  info.group_world_size = assignment->nodes;
  info.base_rank = assignment->base_rank;
  info.world_size = assignment->world_size;
  info.store_host = store_at_.host;
  info.store_port = store_at_.port;
  if (r > 0) info.dropped_nodes = decode_identities(store_->get(round_key(r, "dropped")));
  if (external()) share_workers_store(r, info);
  successors_ = std::move(assignment->successors.endpoints);
  without_standby_ = assignment->successors.without_standby;
  expected_nodes_ = 0;
  previous_rank_ = info.group_rank;
  neighbour_beats_ = -1;
  neighbour_seen_ = next_beat_ = Clock::now();
  watched_ = {};
  stalled_ = false;
  enter_round(r, info.group_rank, info.group_world_size);
  return info;
}

}  // namespace ddprun::rdzv
