// The records of one c10d round and the closer's rank assignment: the one codec of the two '|' formats that
// DynamicRendezvous (rendezvous/c10d/dynamic_rendezvous.h) writes to the store, and of nothing else.
//
//   r<round>/node/<arrival index>     NodeDescriptor
//       "<identity>|<previous node rank>|<local world size>|<standby>"
//   r<round>/assign/<arrival index>   RankAssignment
//       "<node rank>|<nodes>|<base rank>|<world size>|<successors>"
//
// The standby is "host:port" of the node's standby store, or "" (none); the successors are
// StoreFailover::encode's text (rendezvous/c10d/store_failover.h), which contains '|' itself, so it is the last
// field. docs/rendezvous.md describes the keys. An identity must not contain '|'.
//
// Pure: no store, no sockets; thread-safe. Decoders never throw (but std::bad_alloc): a record that is not
// readable yields nullopt and says which part, so that the handler names it (RendezvousBase::unreadable).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/c10d/store_failover.h"

namespace ddprun::rdzv {

// What a decoder could not read: the field's name and its text, or the whole record when it has the wrong
// number of fields.
struct UnreadableField {
  std::string what;  // "node descriptor", "previous node rank", ...
  std::string text;
};

// What a node writes when it joins a round.
struct NodeDescriptor {
  std::string identity;    // unique per agent ("<host>:<pid>")
  int previous_rank = -1;  // its node rank in the previous round; -1: a newcomer
  int local_world_size = 0;
  std::string standby;  // "host:port" of its standby store; "": none
  bool operator==(const NodeDescriptor&) const = default;
};

std::string encode(const NodeDescriptor& d);
std::optional<NodeDescriptor> decode_node_descriptor(std::string_view text, UnreadableField& why);
// The identity a descriptor names (its first field), readable or not: for messages.
std::string identity_of(std::string_view descriptor);

// What the closer writes for each node of the round.
struct RankAssignment {
  int node_rank = 0;
  int nodes = 1;  // the round's node count
  int base_rank = 0;
  int world_size = 0;
  StoreFailover::Successors successors;
};

std::string encode(const RankAssignment& a);
std::optional<RankAssignment> decode_rank_assignment(std::string_view text, UnreadableField& why);

// r<r>/members and r<r>/dropped: identities joined by '|' ("" for none).
std::string encode_identities(const std::vector<std::string>& identities);
std::vector<std::string> decode_identities(std::string_view text);

// Ranks for one round: `previous[i]` is node i's rank in the previous round or -1. A member of the previous
// round keeps its rank when that is below the round's node count (two claiming one rank: the first by
// identity keeps it), so that survivors keep their global ranks; the ranks left over go, in order, to the
// members that could not keep theirs (by previous rank, then identity) and to the newcomers (by identity): a
// spare takes the rank of the node it replaces. Returns the node rank of each arrival index.
std::vector<int> order_nodes(const std::vector<std::string>& identities, const std::vector<int>& previous);

// Which arrivals of a round take part when more than `max_nodes` came: the members of the previous round
// (`member[i]`) first, then the others, each in arrival order. Returns the chosen arrival indices, ascending;
// the rest wait as spares.
std::vector<size_t> select_nodes(const std::vector<bool>& member, int max_nodes);

// The closer's work: the assignment of every node, in arrival order, for the descriptors of the round's nodes
// in arrival order. Node ranks: order_nodes; base ranks and world size: rank_layout over the local world
// sizes in node-rank order; successors (the same for every node): the standbys of the first
// StoreFailover::kSuccessors nodes that have one, in node-rank order, and how many nodes have none.
std::vector<RankAssignment> assign_ranks(const std::vector<NodeDescriptor>& nodes);

}  // namespace ddprun::rdzv
