#include "agent/observe/status_document.h"

#include <limits>
#include <nlohmann/json.hpp>

namespace ddprun::agent {

namespace {

using json = nlohmann::json;

json or_null(const std::optional<int>& v) { return v ? json(*v) : json(); }
json or_null(const std::optional<int64_t>& v) { return v ? json(*v) : json(); }
json or_null(const std::optional<uint64_t>& v) { return v ? json(*v) : json(); }
json or_null(const std::optional<double>& v) { return v ? json(*v) : json(); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Reads the fields of one JSON object by name and type, noting every field present with the wrong type.
class Fields {
 public:
  Fields(const json& object, std::string where, std::vector<std::string>& problems)
      : j_(object), where_(std::move(where)), problems_(problems) {}

  std::string text(const char* name) {
    const json* v = find(name);
    if (!v) return "";
    if (v->is_string()) return v->get<std::string>();
    wrong(name, "a string");
    return "";
  }
  std::optional<double> number(const char* name) {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (v->is_number()) return v->get<double>();
    wrong(name, "a number");
    return std::nullopt;
  }
  std::optional<int64_t> integer(const char* name) {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (v->is_number_integer()) return v->get<int64_t>();
    wrong(name, "an integer");
    return std::nullopt;
  }
  std::optional<int> small_integer(const char* name) {
    auto v = integer(name);
    if (!v) return std::nullopt;
    if (*v >= std::numeric_limits<int>::min() && *v <= std::numeric_limits<int>::max()) return int(*v);
    wrong(name, "an integer of 32 bits");
    return std::nullopt;
  }
  std::optional<uint64_t> count(const char* name) {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<uint64_t>();
    wrong(name, "a non-negative integer");
    return std::nullopt;
  }
  const json* array(const char* name) {
    const json* v = find(name);
    if (!v) return nullptr;
    if (v->is_array()) return v;
    wrong(name, "an array");
    return nullptr;
  }

 private:
  // Absent and null are the same: unknown.
  const json* find(const char* name) const {
    auto it = j_.find(name);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  void wrong(const char* name, const char* expected) {
    problems_.push_back(where_ + ": \"" + name + "\" is not " + expected);
  }

  const json& j_;
  std::string where_;
  std::vector<std::string>& problems_;
};

// Entries read from one array at most: the store bounds a value's size, this bounds the work on it.
constexpr size_t kMaxEntries = 65536;

}  // namespace

std::string status_document_text(const StatusDocument& d) {
  json ranks = json::array();
  for (const RankStatus& r : d.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"local_rank", r.local_rank},
                     {"pid", or_null(r.pid)},
                     {"state", r.state.empty() ? json() : json(r.state)},
                     {"progress_age_s", or_null(r.progress_age_s)},
                     {"step", or_null(r.step)},
                     {"step_time_s", or_null(r.step_time_s)},
                     {"before_collective_s", or_null(r.before_collective_s)},
                     {"state_step", or_null(r.state_step)},
                     {"state_replica_step", or_null(r.state_replica_step)}});
  }
  return dump({{"v", 1},
               {"host", d.host},
               {"pid", or_null(d.pid)},
               {"backend", d.backend},
               {"state", d.state},
               {"detail", d.detail},
               {"time", d.time},
               {"round", or_null(d.round)},
               {"node_rank", or_null(d.node_rank)},
               {"nodes", or_null(d.nodes)},
               {"local_world_size", or_null(d.local_world_size)},
               {"base_rank", or_null(d.base_rank)},
               {"world_size", or_null(d.world_size)},
               {"restarts_used", d.restarts_used},
               {"restarts_max", d.restarts_max},
               {"restarts_caused", d.restarts_caused},
               {"state_bytes", or_null(d.state_bytes)},
               {"ranks", ranks}});
}

std::string straggler_report_text(const StragglerReport& r) {
  json ranks = json::array();
  for (const StragglerEntry& e : r.ranks) {
    ranks.push_back({{"rank", e.rank},
                     {"host", e.host},
                     {"before_collective_s", e.before_collective_s},
                     {"median_s", e.median_s},
                     {"since", e.since}});
  }
  return dump({{"v", 1}, {"round", r.round}, {"factor", r.factor}, {"time", r.time}, {"ranks", ranks}});
}

std::optional<StatusDocument> read_status_document(std::string_view text,
                                                   std::vector<std::string>& problems) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) {
    problems.push_back("not a JSON object");
    return std::nullopt;
  }
  StatusDocument d;
  Fields f(j, "document", problems);
  d.host = f.text("host");
  d.pid = f.integer("pid");
  d.backend = f.text("backend");
  d.state = f.text("state");
  d.detail = f.text("detail");
  d.time = f.number("time").value_or(0);
  d.round = f.small_integer("round");
  d.node_rank = f.small_integer("node_rank");
  d.nodes = f.small_integer("nodes");
  d.local_world_size = f.small_integer("local_world_size");
  d.base_rank = f.small_integer("base_rank");
  d.world_size = f.small_integer("world_size");
  d.restarts_used = f.small_integer("restarts_used").value_or(0);
  d.restarts_max = f.small_integer("restarts_max").value_or(0);
  d.restarts_caused = f.small_integer("restarts_caused").value_or(0);
  d.state_bytes = f.count("state_bytes");
  if (const json* ranks = f.array("ranks")) {
    size_t i = 0;
    for (const json& r : *ranks) {
      const std::string where = "ranks[" + std::to_string(i++) + "]";
      if (i > kMaxEntries) {
        problems.push_back("more than " + std::to_string(kMaxEntries) + " ranks: the rest skipped");
        break;
      }
      if (!r.is_object()) {
        problems.push_back(where + " is not an object: skipped");
        continue;
      }
      Fields rf(r, where, problems);
      RankStatus s;
      auto rank = rf.small_integer("rank");
      if (!rank || *rank < 0) {
        problems.push_back(where + " has no rank: skipped");
        continue;
      }
      s.rank = *rank;
      s.local_rank = rf.small_integer("local_rank").value_or(-1);
      s.pid = rf.integer("pid");
      s.state = rf.text("state");
      s.progress_age_s = rf.number("progress_age_s");
      s.step = rf.count("step");
      s.step_time_s = rf.number("step_time_s");
      s.before_collective_s = rf.number("before_collective_s");
      s.state_step = rf.integer("state_step");
      s.state_replica_step = rf.integer("state_replica_step");
      d.ranks.push_back(std::move(s));
    }
  }
  return d;
}

std::optional<StragglerReport> read_straggler_report(std::string_view text,
                                                     std::vector<std::string>& problems) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) {
    problems.push_back("not a JSON object");
    return std::nullopt;
  }
  StragglerReport r;
  Fields f(j, "straggler report", problems);
  r.round = f.small_integer("round").value_or(-1);
  r.factor = f.number("factor").value_or(0);
  r.time = f.number("time").value_or(0);
  if (const json* ranks = f.array("ranks")) {
    size_t i = 0;
    for (const json& e : *ranks) {
      const std::string where = "straggler report ranks[" + std::to_string(i++) + "]";
      if (i > kMaxEntries) break;
      if (!e.is_object()) {
        problems.push_back(where + " is not an object: skipped");
        continue;
      }
      Fields ef(e, where, problems);
      auto rank = ef.small_integer("rank");
      if (!rank || *rank < 0) {
        problems.push_back(where + " has no rank: skipped");
        continue;
      }
      r.ranks.push_back(StragglerEntry{.rank = *rank,
                                       .host = ef.text("host"),
                                       .before_collective_s = ef.number("before_collective_s").value_or(0),
                                       .median_s = ef.number("median_s").value_or(0),
                                       .since = ef.number("since").value_or(0)});
    }
  }
  return r;
}

}  // namespace ddprun::agent
