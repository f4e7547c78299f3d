#include "rendezvous/static_rendezvous.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "rendezvous/util/duration_text.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

using std::chrono::milliseconds;

StaticRendezvous::StaticRendezvous(StaticRendezvousOptions options)
    : RendezvousBase(options.run_id, options.auth), options_(std::move(options)) {
  uint16_t port = options_.master_port;
  if (options_.host_store) {
    StoreServerOptions so;
    so.host = options_.bind_host;
    so.port = options_.master_port;
    so.memory_budget = options_.store_memory_budget;
    port = host_store(so);
  }
  connect(options_.master_addr, port,
          Timeouts{.connect = options_.connect_timeout,
                   .request = options_.join_timeout,
                   .watcher_request = std::min(options_.connect_timeout, milliseconds(5000)),
                   .stall_tolerance = options_.connect_timeout});
}

StaticRendezvous::~StaticRendezvous() = default;

RendezvousInfo StaticRendezvous::do_next_rendezvous(int local_world_size) {
  if (do_is_closed()) throw closed_error();
  const int r = round_.load() + 1;
  claim_node_rank(r);
  store_->set(round_key(r, "lws/" + std::to_string(options_.node_rank)), std::to_string(local_world_size));
  if (store_->add(round_key(r, "joined"), 1) == options_.nnodes) {
    keys_.open_worker_keyspace(*store_, r);
    store_->set(round_key(r, "complete"), "1");
  }
  wait_complete(r);
  RendezvousInfo info = round_info(r);
  enter_round(r, options_.node_rank, options_.nnodes);
  return info;
}

void StaticRendezvous::claim_node_rank(int r) {
  // A second agent with the same --node_rank would make the round complete without a real node.
  const std::string me = local_hostname() + ":" + std::to_string(::getpid());
  const std::string owner =
      store_->compare_set(round_key(r, "node/" + std::to_string(options_.node_rank)), "", me);
  if (owner == me) return;
  throw RendezvousConflictError("rendezvous '" + run_id() + "' at " + endpoint() + ": --node_rank " +
                                std::to_string(options_.node_rank) + " is already taken by agent " + owner +
                                "; give every node a distinct --node_rank in 0.." +
                                std::to_string(options_.nnodes - 1) + " (or stop the other agent)");
}

void StaticRendezvous::wait_complete(int r) {
  const int n = options_.nnodes;
  const auto deadline = Clock::now() + options_.join_timeout;
  int64_t joined = 0;
  while (true) {
    std::string missing;  // set at the deadline: the node ranks that never joined
    try {
      auto count = wait_or_count(round_key(r, "complete"), round_key(r, "joined"), deadline,
                                 options_.progress_interval);
      if (!count) return;
      joined = *count;
      if (Clock::now() < deadline) {
        // Naming the missing ranks costs a request per node, on every node and every progress line: only for
        // small jobs (the join timeout's error names them whatever the size).
        const std::string who = n <= kNamedInProgress ? "node ranks " + missing_node_ranks(r) : "the others";
        spdlog::info("rendezvous {} round {}: {}/{} nodes joined, waiting for {} at {}", run_id(), r, joined,
                     n, who, endpoint());
        continue;
      }
      missing = missing_node_ranks(r);
    } catch (const ConnectionLostError& e) {
      // Node 0's agent hosts the store; it leaves before the round completes only when it gave up waiting
      // (its join timeout, usually a little ahead of ours) or was stopped. Report the timeout, not the
      // socket, whichever of this loop's requests was under way.
      throw RendezvousTimeoutError(
          "rendezvous '" + run_id() + "' round " + std::to_string(r) + ": the store at " + endpoint() +
          " (node 0's agent) went away while this node waited for the other nodes (" +
          std::to_string(joined) + " of " + std::to_string(n) +
          " had joined): node 0 gave up, most likely at its join timeout (" +
          duration_text(options_.join_timeout) +
          " here). Start ddprun on every node within join_timeout of the first, with --nnodes " +
          std::to_string(n) + " and the same --master_addr/--master_port (" + e.what() + ")");
    }
    throw RendezvousTimeoutError(
        "rendezvous '" + run_id() + "' round " + std::to_string(r) + ": only " + std::to_string(joined) +
        " of " + std::to_string(n) + " nodes joined within " + duration_text(options_.join_timeout) + " at " +
        endpoint() + "; missing node ranks: " + missing + ". Start ddprun on every node with --nnodes " +
        std::to_string(n) + " and the same --master_addr/--master_port");
  }
}

std::string StaticRendezvous::missing_node_ranks(int r) {
  std::string missing;
  int listed = 0, more = 0;
  for (int i = 0; i < options_.nnodes; ++i) {
    if (store_->check({round_key(r, "lws/" + std::to_string(i))})) continue;
    if (listed++ < 32) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    } else {
      ++more;
    }
  }
  return more > 0 ? missing + " and " + std::to_string(more) + " more" : missing;
}

RendezvousInfo StaticRendezvous::round_info(int r) {
  const int n = options_.nnodes;
  std::vector<std::string> lws_keys;
  for (int i = 0; i < n; ++i) lws_keys.push_back(round_key(r, "lws/" + std::to_string(i)));
  RendezvousInfo info;
  info.round = r;
  info.group_rank = options_.node_rank;
  info.group_world_size = n;
  info.store_host = options_.advertised_addr.empty() ? options_.master_addr : options_.advertised_addr;
  info.store_port = store_port();
  auto sizes = store_->multi_get(lws_keys);
  std::vector<int> local_world_sizes;
  for (int i = 0; i < n; ++i) {
    local_world_sizes.push_back(
        read_int(sizes[static_cast<size_t>(i)], "local world size of node " + std::to_string(i), 0));
  }
  const RankLayout layout = rank_layout(local_world_sizes);
  info.base_rank = layout.base_ranks[static_cast<size_t>(options_.node_rank)];
  info.world_size = layout.world_size;
  return info;
}

namespace {

const char* const kNoFailover =
    ". The static backend (--nnodes N) cannot change its world size, so the job cannot outlive the store's "
    "host "
    "(node 0); to survive the loss of any node, the store's host included, run every node with "
    "--rdzv_backend "
    "c10d --nnodes MIN:MAX";

}  // namespace

std::optional<RoundStop> StaticRendezvous::do_wait_round_stopped(std::chrono::milliseconds timeout) {
  try {
    return RendezvousBase::do_wait_round_stopped(timeout);
  } catch (const RendezvousStoreError& e) {
    throw RendezvousStoreError(e.what() + std::string(kNoFailover));
  }
}

RendezvousStoreError StaticRendezvous::store_failure(const StoreError& e) const {
  RendezvousStoreError error = RendezvousBase::store_failure(e);
  if (!StoreSilence::silent_or_gone(e) || round_.load() < 0)
    return error;  // before the first round: the store was never reached
  return RendezvousStoreError(error.what() + std::string(kNoFailover));
}

}  // namespace ddprun::rdzv
