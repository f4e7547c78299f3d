#include "agent/state/state_peers.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "rendezvous/round_keys.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

using json = nlohmann::json;

json steps_json(const std::map<int, std::vector<int64_t>>& m) {
  json out = json::object();
  for (const auto& [rank, steps] : m) out[std::to_string(rank)] = steps;
  return out;
}

std::map<int, std::vector<int64_t>> steps_of(const json& j) {
  std::map<int, std::vector<int64_t>> out;
  if (!j.is_object()) return out;
  for (const auto& [key, value] : j.items()) {
    const auto rank = parse_int_in<int>(key, 0, 1 << 30);
    if (!rank || !value.is_array()) continue;
    std::vector<int64_t> steps;
    for (const auto& s : value) {
      if (s.is_number_integer() && s.get<int64_t>() >= 0) steps.push_back(s.get<int64_t>());
    }
    std::sort(steps.begin(), steps.end());
    out[*rank] = std::move(steps);
  }
  return out;
}

}  // namespace

std::optional<int64_t> NodeState::newest(int rank) const {
  std::optional<int64_t> best;
  for (const auto* m : {&own, &replica}) {
    auto it = m->find(rank);
    if (it != m->end() && !it->second.empty() && (!best || it->second.back() > *best))
      best = it->second.back();
  }
  return best;
}

bool NodeState::holds(int rank, int64_t step) const {
  for (const auto* m : {&own, &replica}) {
    auto it = m->find(rank);
    if (it != m->end() && std::find(it->second.begin(), it->second.end(), step) != it->second.end())
      return true;
  }
  return false;
}

std::optional<int64_t> newest_common_step(const std::vector<NodeState>& nodes, int world_size) {
  if (world_size <= 0) return std::nullopt;
  std::set<int64_t> common;  // the steps every rank so far has somewhere
  for (int rank = 0; rank < world_size; ++rank) {
    std::set<int64_t> steps;
    for (const NodeState& n : nodes) {
      for (const auto* m : {&n.own, &n.replica}) {
        if (auto it = m->find(rank); it != m->end()) steps.insert(it->second.begin(), it->second.end());
      }
    }
    if (rank == 0) {
      common = std::move(steps);
    } else {
      std::erase_if(common, [&](int64_t s) { return !steps.count(s); });
    }
    if (common.empty()) return std::nullopt;
  }
  return *common.rbegin();
}

std::string node_state_key(const std::string& run_id, int round, int node_rank) {
  return rdzv::RoundKeys(run_id).round_key(round, "state/n" + std::to_string(node_rank));
}

std::string node_state_text(const NodeState& s) {
  return json{{"v", 1},
              {"addr", s.addr.to_string()},
              {"ranks", {s.first_rank, s.last_rank}},
              {"own", steps_json(s.own)},
              {"replica", steps_json(s.replica)}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<NodeState> read_node_state(std::string_view text, std::string& why) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) {
    why = "not a JSON object";
    return std::nullopt;
  }
  NodeState s;
  const auto addr = j.find("addr");
  std::string error;
  const auto ep = addr != j.end() && addr->is_string()
                      ? rdzv::parse_endpoint(addr->get<std::string>(), std::nullopt, error)
                      : std::nullopt;
  if (!ep || ep->port == 0) {
    why = "no usable \"addr\"" + (error.empty() ? "" : ": " + error);
    return std::nullopt;
  }
  s.addr = *ep;
  if (const auto r = j.find("ranks"); r != j.end() && r->is_array() && r->size() == 2 &&
                                      (*r)[0].is_number_integer() && (*r)[1].is_number_integer()) {
    s.first_rank = (*r)[0].get<int>();
    s.last_rank = (*r)[1].get<int>();
  }
  if (const auto o = j.find("own"); o != j.end()) s.own = steps_of(*o);
  if (const auto o = j.find("replica"); o != j.end()) s.replica = steps_of(*o);
  return s;
}

std::optional<int> buddy_of(int node_rank, int nodes) {
  if (nodes < 2) return std::nullopt;
  return (node_rank + 1) % nodes;
}

}  // namespace ddprun::agent
