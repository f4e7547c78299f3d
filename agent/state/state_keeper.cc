#include "agent/state/state_keeper.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include "agent/state/state_connection.h"
#include "rendezvous/reachability.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
constexpr milliseconds kIdle{30000};

}  // namespace

StateKeeper::StateKeeper(const AgentConfig& config) : config_(config), dir_(config.state.dir) {
  guard_.emplace(dir_.dir());
  replicator_ = std::make_unique<Replicator>(dir_, config.state.bandwidth);
  spdlog::info("training state in {} (--state_memory {})", dir_.dir().string(),
               mib_text(config.state.memory));
}

StateKeeper::~StateKeeper() {
  replicator_.reset();
  server_.reset();
  dir_.remove();
}

std::vector<int> StateKeeper::local_ranks() const {
  std::vector<int> ranks;
  std::lock_guard lock(mu_);
  if (!round_) return ranks;
  for (size_t lr = 0; lr < config_.workers.size(); ++lr)
    ranks.push_back(round_->rank_of(static_cast<int>(lr)));
  return ranks;
}

NodeState StateKeeper::node_state(const rdzv::Endpoint& me) const {
  NodeState s;
  s.addr = me;
  const auto ranks = local_ranks();
  if (!ranks.empty()) {
    s.first_rank = ranks.front();
    s.last_rank = ranks.back();
  }
  for (const auto& v : StateDirectory::versions(dir_.own())) s.own[v.name.rank].push_back(v.name.step);
  for (const auto& v : StateDirectory::versions(dir_.replica()))
    s.replica[v.name.rank].push_back(v.name.step);
  return s;
}

void StateKeeper::before_spawn(const rdzv::RendezvousInfo& round,
                               const std::optional<rdzv::StoreAccess>& store) {
  {
    std::lock_guard lock(mu_);
    round_ = round;
  }
  const auto removed = StateDirectory::remove_temporaries(dir_.own());
  if (!removed.empty()) {
    spdlog::info("round {}: removed {} unfinished version(s) of workers killed while saving: {}", round.round,
                 removed.size(), join(removed, ", "));
  }
  if (!store) {
    if (!warned_no_store_) {
      spdlog::warn(
          "training state: this rendezvous backend has no ddprun store: the state stays on this node, "
          "not copied to another (docs/state.md)");
      warned_no_store_ = true;
    }
    replicator_->set_target(std::nullopt);
    return;
  }
  try {
    if (!server_) {
      server_ = std::make_unique<StateServer>(
          dir_, config_.state.advertise_addr, store->auth,
          config_.state.replica_quota(static_cast<int>(config_.workers.size())));
      spdlog::info("training state: this agent keeps the copies of the previous node's on port {}{}",
                   server_->port(), store->auth ? " (for the job's agents only)" : "");
    }
  } catch (const std::system_error& e) {
    spdlog::warn("training state: {}: the state stays on this node, not copied to another", e.what());
    replicator_->set_target(std::nullopt);
    return;
  }
  std::string host = config_.state.advertise_addr;
  if (host.empty()) host = rdzv::source_address_towards(store->host, store->port);
  if (host.empty()) host = local_hostname();
  const rdzv::Endpoint me{host, server_->port()};
  try {
    rdzv::StoreClientOptions options;
    options.connect_timeout = kStoreTimeout;
    options.timeout = kStoreTimeout;
    options.auth = store->auth;
    rdzv::StoreClient client(store->host, store->port, options);
    const NodeState mine = node_state(me);
    client.set(node_state_key(store->run_id, round.round, round.group_rank), node_state_text(mine));
    std::vector<int> missing;
    for (int rank : local_ranks()) {
      if (!StateDirectory::newest(dir_.own(), rank)) missing.push_back(rank);
    }
    // A job's first round has nothing to restore; a later one does for a node that takes a lost one's ranks.
    if (!missing.empty() && round.group_world_size > 1 && round.round > 0)
      restore(missing, mine, round, *store, client);
  } catch (const rdzv::StoreError& e) {
    spdlog::warn("training state: round {}: the job's store: {}", round.round, e.what());
  }
  if (const auto buddy = buddy_of(round.group_rank, round.group_world_size)) {
    replicator_->set_target(
        Replicator::Target{.store = *store, .round = round.round, .buddy = *buddy, .ranks = local_ranks()});
  } else {
    replicator_->set_target(std::nullopt);
  }
}

void StateKeeper::restore(const std::vector<int>& missing, const NodeState& mine,
                          const rdzv::RendezvousInfo& round, const rdzv::StoreAccess& access,
                          rdzv::Store& store) {
  const auto start = Clock::now();
  std::vector<std::string> keys;
  for (int n = 0; n < round.group_world_size; ++n) {
    if (n != round.group_rank) keys.push_back(node_state_key(access.run_id, round.round, n));
  }
  try {
    store.wait(keys, kPeersWait);
  } catch (const rdzv::WaitTimeoutError&) {
    spdlog::warn(
        "training state: round {}: not every node published what it holds within {}; restoring from "
        "those that did",
        round.round, duration_text(kPeersWait));
  }
  std::vector<NodeState> peers;
  for (const std::string& key : keys) {
    if (!store.check({key})) continue;
    std::string why;
    if (auto doc = read_node_state(store.get(key), why)) {
      peers.push_back(std::move(*doc));
    } else {
      spdlog::warn("training state: round {}: skipped the unreadable document {}: {}", round.round, key, why);
    }
  }
  // The step the workers will agree on: only its version is needed (newer ones are deleted by their load()).
  std::vector<NodeState> everyone = peers;
  everyone.push_back(mine);
  const std::optional<int64_t> common = newest_common_step(everyone, round.world_size);
  for (int rank : missing) {
    std::vector<const NodeState*> holders;
    for (const NodeState& p : peers) {
      if (common ? p.holds(rank, *common) : p.newest(rank).has_value()) holders.push_back(&p);
    }
    std::stable_sort(holders.begin(), holders.end(), [rank](const NodeState* a, const NodeState* b) {
      return *a->newest(rank) > *b->newest(rank);
    });
    bool restored = false;
    for (const NodeState* h : holders) {
      try {
        const auto t0 = Clock::now();
        const int n = fetch(rank, h->addr, access.auth.get(), common.value_or(kEveryStep));
        if (n == 0) continue;
        const auto v = StateDirectory::newest(dir_.own(), rank);
        spdlog::info(
            "round {}: restored rank {}'s state (newest step {}, {} version(s), {}) from the agent at {} in "
            "{}",
            round.round, rank, v ? v->name.step : -1, n, mib_text(v ? v->bytes : 0), h->addr.to_string(),
            duration_text(std::chrono::duration_cast<milliseconds>(Clock::now() - t0)));
        restored = true;
        break;
      } catch (const StateTransferError& e) {
        spdlog::warn("training state: round {}: cannot restore rank {} from {}: {}", round.round, rank,
                     h->addr.to_string(), e.what());
      }
    }
    if (!restored) {
      spdlog::warn(
          "round {}: no node holds a version of rank {}'s state: its workers start without one "
          "(ddprun.state.load() returns None; the script's own checkpoint applies)",
          round.round, rank);
    }
  }
  spdlog::debug("training state: round {}: restore took {}", round.round,
                duration_text(std::chrono::duration_cast<milliseconds>(Clock::now() - start)));
}

int StateKeeper::fetch(int rank, const rdzv::Endpoint& holder, const rdzv::StoreAuth* auth, int64_t step) {
  StateConnection c = StateConnection::connect(holder.host, holder.port, kStoreTimeout, kIdle);
  c.client_handshake(auth);
  c.send(StateMessage{.kind = StateMessage::Kind::kGet, .rank = rank, .step = step});
  int committed = 0;
  while (true) {
    const StateMessage m = c.receive();
    if (m.kind == StateMessage::Kind::kEnd) return committed;
    if (m.kind != StateMessage::Kind::kVersion || m.rank != rank) {
      throw StateTransferError("the agent at " + c.peer() + " answered a request for rank " +
                               std::to_string(rank) + " with '" + encode_message(m) + "'");
    }
    const VersionName name{m.rank, m.step};
    const auto tmp = dir_.own() / ("." + version_file_name(name) + ".restore.tmp");
    if (std::string why = c.receive_version(rank, m.step, m.bytes, tmp, dir_.own() / version_file_name(name));
        !why.empty()) {
      throw StateTransferError("the agent at " + c.peer() + " sent rank " + std::to_string(rank) +
                               "'s step " + std::to_string(m.step) + ": " + why);
    }
    ++committed;
  }
}

StateStats StateKeeper::stats() const {
  StateStats s;
  const auto replicated = replicator_->stats().replicated;
  const auto own = StateDirectory::versions(dir_.own());
  for (int rank : local_ranks()) {
    StateStats::Rank r{.rank = rank};
    for (const auto& v : own) {
      if (v.name.rank == rank) r.step = v.name.step;
    }
    if (auto it = replicated.find(rank); it != replicated.end()) r.replica_step = it->second;
    s.ranks.push_back(r);
  }
  s.bytes_held = dir_.bytes_held();
  return s;
}

}  // namespace ddprun::agent
