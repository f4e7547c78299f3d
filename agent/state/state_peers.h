// What each agent of a --state_memory job publishes in the job's store at the start of every round, for the
// others (docs/state.md, "Between agents"): where its state server listens (agent/state/state_server.h) and
// the versions it holds, its own ranks' and the copies of its buddy's. The next node's agent reads it to send
// its copies there; an agent whose ranks have no version on its node (a spare, a new node) reads them all to
// find where they are.
//
// Key: "ddprun/<run_id>/r<round>/state/n<node_rank>" (rendezvous/round_keys.h's namespace). Document (JSON):
//   {"v": 1, "addr": "host:port", "ranks": [first, last], "own": {"<rank>": [steps...]},
//    "replica": {"<rank>": [steps...]}}
// Anyone who reaches an open store can write it: read_node_state() is tolerant (nullopt with the reason for a
// document it cannot use; entries of the wrong type skipped).
//
// Pure; thread-safe. Nothing throws but std::bad_alloc.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store/endpoint.h"

namespace ddprun::agent {

struct NodeState {
  rdzv::Endpoint addr;
  int first_rank = 0, last_rank = -1;           // this node's ranks in the round
  std::map<int, std::vector<int64_t>> own;      // rank -> committed steps, oldest first
  std::map<int, std::vector<int64_t>> replica;  // the buddy's ranks it holds copies of

  // The newest step it holds of `rank` (own or copy), if any.
  std::optional<int64_t> newest(int rank) const;
  // Whether it holds `rank`'s version of `step` (own or copy).
  bool holds(int rank, int64_t step) const;
};

// The newest step of which some node of `nodes` holds a version of every rank 0..world_size-1: the step the
// workers' load() will agree on once the ranks a node lost are restored (unless a holder is lost meanwhile);
// nullopt when there is none (a rank nobody holds, a node whose document is missing).
std::optional<int64_t> newest_common_step(const std::vector<NodeState>& nodes, int world_size);

std::string node_state_key(const std::string& run_id, int round, int node_rank);
std::string node_state_text(const NodeState& s);
std::optional<NodeState> read_node_state(std::string_view text, std::string& why);

// The node whose agent keeps the copies of node `node_rank`'s ranks: the next one of the round (none alone).
std::optional<int> buddy_of(int node_rank, int nodes);

}  // namespace ddprun::agent
