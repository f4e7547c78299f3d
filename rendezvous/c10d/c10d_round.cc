#include "rendezvous/c10d/c10d_round.h"

#include <algorithm>
#include <climits>
#include <numeric>

#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

namespace {

// The field as an int in min..INT_MAX, or nullopt with `why` naming it.
std::optional<int> read_field(std::string_view text, const char* what, int min, UnreadableField& why) {
  auto v = parse_int(text);
  if (v && *v >= min && *v <= INT_MAX) return static_cast<int>(*v);
  why = {what, std::string(text)};
  return std::nullopt;
}

}  // namespace

std::string encode(const NodeDescriptor& d) {
  return d.identity + "|" + std::to_string(d.previous_rank) + "|" + std::to_string(d.local_world_size) + "|" +
         d.standby;
}

std::optional<NodeDescriptor> decode_node_descriptor(std::string_view text, UnreadableField& why) {
  const auto f = split(text, '|');
  if (f.size() != 4) {
    why = {"node descriptor", std::string(text)};
    return std::nullopt;
  }
  auto previous = read_field(f[1], "previous node rank", -1, why);
  auto local_world_size = previous ? read_field(f[2], "local world size", 0, why) : std::nullopt;
  if (!local_world_size) return std::nullopt;
  return NodeDescriptor{
      .identity = f[0], .previous_rank = *previous, .local_world_size = *local_world_size, .standby = f[3]};
}

std::string identity_of(std::string_view descriptor) {
  return std::string(descriptor.substr(0, descriptor.find('|')));
}

std::string encode(const RankAssignment& a) {
  return std::to_string(a.node_rank) + "|" + std::to_string(a.nodes) + "|" + std::to_string(a.base_rank) +
         "|" + std::to_string(a.world_size) + "|" + StoreFailover::encode(a.successors);
}

std::optional<RankAssignment> decode_rank_assignment(std::string_view text, UnreadableField& why) {
  // The first four fields, then the successors (which contain a '|' of their own).
  std::vector<std::string_view> head;
  std::string_view rest = text;
  for (size_t bar; head.size() < 4 && (bar = rest.find('|')) != std::string_view::npos;
       rest.remove_prefix(bar + 1)) {
    head.push_back(rest.substr(0, bar));
  }
  auto successors = head.size() == 4 ? StoreFailover::decode(rest) : std::nullopt;
  if (!successors) {
    why = {"rank assignment", std::string(text)};
    return std::nullopt;
  }
  auto node_rank = read_field(head[0], "node rank", 0, why);
  auto nodes = node_rank ? read_field(head[1], "node count", 1, why) : std::nullopt;
  auto base_rank = nodes ? read_field(head[2], "base rank", 0, why) : std::nullopt;
  auto world_size = base_rank ? read_field(head[3], "world size", 0, why) : std::nullopt;
  if (!world_size) return std::nullopt;
  return RankAssignment{.node_rank = *node_rank,
                        .nodes = *nodes,
                        .base_rank = *base_rank,
                        .world_size = *world_size,
                        .successors = std::move(*successors)};
}

std::string encode_identities(const std::vector<std::string>& identities) {
  std::string out;
  for (const auto& id : identities) out += (out.empty() ? "" : "|") + id;
  return out;
}

std::vector<std::string> decode_identities(std::string_view text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  for (size_t start = 0;;) {
    const size_t bar = text.find('|', start);
    out.emplace_back(
        text.substr(start, bar == std::string_view::npos ? std::string_view::npos : bar - start));
    if (bar == std::string_view::npos) return out;
    start = bar + 1;
  }
}

std::vector<int> order_nodes(const std::vector<std::string>& identities, const std::vector<int>& previous) {
  const size_t n = identities.size();
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    bool na = previous[a] < 0, nb = previous[b] < 0;
    if (na != nb) return nb;  // members of the previous round first
    if (!na && previous[a] != previous[b]) return previous[a] < previous[b];
    return identities[a] < identities[b];
  });
  std::vector<int> rank(n, -1);
  std::vector<bool> taken(n, false);
  for (size_t i : idx) {  // members keep the rank they had, where it still exists and is free
    const int p = previous[i];
    if (p < 0 || static_cast<size_t>(p) >= n || taken[static_cast<size_t>(p)]) continue;
    rank[i] = p;
    taken[static_cast<size_t>(p)] = true;
  }
  size_t next_free = 0;
  for (size_t i : idx) {  // everyone else takes the lowest free rank, in the same order
    if (rank[i] >= 0) continue;
    while (taken[next_free]) ++next_free;
    rank[i] = static_cast<int>(next_free);
    taken[next_free] = true;
  }
  return rank;
}

std::vector<size_t> select_nodes(const std::vector<bool>& member, int max_nodes) {
  std::vector<size_t> chosen;
  const auto room = static_cast<size_t>(std::max(max_nodes, 0));
  for (bool members : {true, false}) {
    for (size_t i = 0; i < member.size() && chosen.size() < room; ++i) {
      if (member[i] == members) chosen.push_back(i);
    }
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

std::vector<RankAssignment> assign_ranks(const std::vector<NodeDescriptor>& nodes) {
  std::vector<std::string> identities;
  std::vector<int> previous;
  for (const NodeDescriptor& d : nodes) {
    identities.push_back(d.identity);
    previous.push_back(d.previous_rank);
  }
  const std::vector<int> rank = order_nodes(identities, previous);
  std::vector<const NodeDescriptor*> by_rank(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) by_rank[static_cast<size_t>(rank[i])] = &nodes[i];
  std::vector<int> local_world_sizes;
  StoreFailover::Successors successors;
  for (const NodeDescriptor* d : by_rank) {
    local_world_sizes.push_back(d->local_world_size);
    std::string error;
    auto standby = d->standby.empty() ? std::nullopt : parse_endpoint(d->standby, std::nullopt, error);
    if (!standby) {
      ++successors.without_standby;
    } else if (successors.endpoints.size() < StoreFailover::kSuccessors) {
      successors.endpoints.push_back(*standby);
    }
  }
  const RankLayout layout = rank_layout(local_world_sizes);
  std::vector<RankAssignment> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto r = static_cast<size_t>(rank[i]);
    out.push_back(RankAssignment{.node_rank = rank[i],
                                 .nodes = static_cast<int>(nodes.size()),
                                 .base_rank = layout.base_ranks[r],
                                 .world_size = layout.world_size,
                                 .successors = successors});
  }
  return out;
}

}  // namespace ddprun::rdzv
