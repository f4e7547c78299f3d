#include "launcher/status/job_status.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <set>
#include <sstream>

#include "agent/observe/status_document.h"
#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/round_keys.h"
#include "rendezvous/util/text_util.h"
#include "rendezvous/util/unix_time.h"

namespace ddprun::launcher {

namespace {

using json = nlohmann::json;

template <class T>
json or_null(const std::optional<T>& v) {
  return v ? json(*v) : json();
}

// "0-3", "0,2,5-6"; "-" for none.
std::string rank_ranges(const json& ranks) {
  std::vector<int> r;
  for (const auto& v : ranks) r.push_back(v.get<int>());
  if (r.empty()) return "-";
  std::sort(r.begin(), r.end());
  std::string out;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(r[i]) + (j > i ? "-" + std::to_string(r[j]) : "");
    i = j + 1;
  }
  return out;
}

std::string seconds_text(const json& v, const char* suffix = "") {
  if (!v.is_number()) return "-";
  char buf[32];
  const double s = v.get<double>();
  std::snprintf(buf, sizeof buf, s < 10 ? "%.1f s%s" : "%.0f s%s", s, suffix);
  return buf;
}

// "0.052 s"; "-" when unknown.
std::string milliseconds_text(const json& v) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", v.get<double>());
  return buf;
}

std::string value_text(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// "14:03:27": the local time of unix seconds `t`.
std::string clock_text(const json& t) {
  const time_t secs = static_cast<time_t>(t.is_number() ? t.get<double>() : 0);
  tm local{};
  char buf[16] = "?";
  if (::localtime_r(&secs, &local)) std::strftime(buf, sizeof buf, "%H:%M:%S", &local);
  return buf;
}

// Columns padded to their widest cell.
std::string columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace

namespace {

// What the store holds of a job, read tolerantly: every agent's document (an unreadable one as state
// "unreadable"), what could not be read, and the job's round and its stop.
struct JobRecords {
  std::vector<std::string> identities;
  std::vector<agent::StatusDocument> docs;
  std::vector<bool> live;  // per document: false when a c10d agent's live/ key is gone
  json skipped = json::array();
  int round = -1;
  std::optional<rdzv::RoundStop> stop;
  std::set<int> flagged;  // the ranks node rank 0 flags in `round` (agent/observe/straggler_watch.h)
  bool closed = false;
};

JobRecords read_records(rdzv::Store& store, const rdzv::RoundKeys& keys, const std::string& endpoint) {
  JobRecords r;
  r.identities = keys.status_identities(store);
  if (r.identities.empty()) {
    throw JobNotFound("no agent of job '" + keys.run_id() + "' has published its status at " + endpoint +
                      ": no such --rdzv_id there, or its agents are of a ddprun without `ddprun status`");
  }
  const std::vector<std::string> texts = keys.status_documents(store, r.identities);
  r.closed = store.check({keys.key("closed")});
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<std::string> problems;
    auto d = agent::read_status_document(texts[i], problems);
    for (const std::string& p : problems) r.skipped.push_back("agent " + r.identities[i] + ": " + p);
    if (!d) d = agent::StatusDocument{.state = "unreadable"};
    r.round = std::max(r.round, d->round.value_or(-1));
    r.docs.push_back(std::move(*d));
  }
  // c10d: the round the store says the job runs (its closer's key), rather than what a document claims.
  if (store.check({keys.key("round")})) {
    if (auto round = parse_int_in<int>(store.get(keys.key("round")), 0, INT32_MAX)) r.round = *round;
  }
  if (r.round >= 0 && store.check({keys.round_key(r.round, "stop")})) {
    r.stop = rdzv::decode_round_stop(store.get(keys.round_key(r.round, "stop")));
  }
  if (auto text = keys.stragglers(store)) {
    std::vector<std::string> problems;
    if (auto report = agent::read_straggler_report(*text, problems); report && report->round == r.round) {
      for (const agent::StragglerEntry& e : report->ranks) r.flagged.insert(e.rank);
    }
    for (const std::string& p : problems) r.skipped.push_back(p);
  }
  // c10d agents that have not finished: do they still hold their connection-bound live/ key?
  r.live.assign(r.docs.size(), true);
  std::vector<std::string> live_keys;
  std::vector<size_t> asked;
  for (size_t i = 0; i < r.docs.size(); ++i) {
    const std::string& state = r.docs[i].state;
    if (r.docs[i].backend == "c10d" && state != "done" && state != "failed" && state != "unhealthy") {
      live_keys.push_back(keys.key("live/" + r.identities[i]));
      asked.push_back(i);
    }
  }
  const std::vector<bool> present = rdzv::keys_present(store, live_keys);
  for (size_t k = 0; k < asked.size(); ++k) r.live[asked[k]] = present[k];
  return r;
}

// A node's state as `ddprun status` shows it: its agent's, or lost (its c10d agent's connection is gone), or
// spare (it waits while the job runs a round without it).
std::string node_state(const JobRecords& r, size_t i) {
  const agent::StatusDocument& d = r.docs[i];
  const std::string state = d.state.empty() ? "unknown" : d.state;
  if (!r.live[i]) return "lost";
  const bool finished = state == "done" || state == "failed";
  if (!finished && d.round != r.round && r.round >= 0 && !r.closed && state != "unhealthy") return "spare";
  return state;
}

json rank_entry(const JobRecords& r, const agent::StatusDocument& d, const agent::RankStatus& rank,
                const json& node_rank) {
  return {{"rank", rank.rank},
          {"node_rank", node_rank},
          {"local_rank", rank.local_rank},
          {"host", d.host},
          {"pid", or_null(rank.pid)},
          {"state", rank.state.empty() ? json() : json(rank.state)},
          {"progress_age_s", or_null(rank.progress_age_s)},
          {"step", or_null(rank.step)},
          {"step_time_s", or_null(rank.step_time_s)},
          {"before_collective_s", or_null(rank.before_collective_s)},
          {"straggler", rank.before_collective_s ? json(r.flagged.count(rank.rank) > 0) : json()}};
}

std::string job_state(const JobRecords& r, bool any_failed, bool any_running) {
  if (r.closed || (r.stop && r.stop->kind == rdzv::RoundStop::Kind::kDone))
    return any_failed ? "failed" : "done";
  if (r.stop) return "restarting";
  return any_running ? "running" : "forming";
}

}  // namespace

json read_job_status(rdzv::Store& store, const std::string& run_id, const std::string& endpoint) {
  const JobRecords r = read_records(store, rdzv::RoundKeys(run_id), endpoint);
  const double now = unix_now();
  json nodes = json::array(), ranks = json::array();
  int used = 0, max = 0;
  bool any_failed = false, any_running = false;
  for (size_t i = 0; i < r.docs.size(); ++i) {
    const agent::StatusDocument& d = r.docs[i];
    const std::string state = node_state(r, i);
    const bool in_round = r.round >= 0 && d.round == r.round;
    any_failed = any_failed || state == "failed";
    any_running = any_running || (in_round && state == "running");
    used = std::max(used, d.restarts_used);
    max = std::max(max, d.restarts_max);
    json node_ranks = json::array();
    const json node_rank = in_round && d.node_rank ? json(*d.node_rank) : json();
    if (in_round) {
      for (const agent::RankStatus& rank : d.ranks) {
        node_ranks.push_back(rank.rank);
        ranks.push_back(rank_entry(r, d, rank, node_rank));
      }
    }
    nodes.push_back({{"identity", r.identities[i]},
                     {"node_rank", node_rank},
                     {"host", d.host},
                     {"agent_pid", or_null(d.pid)},
                     {"state", state},
                     {"detail", d.detail},
                     {"heartbeat_age_s", d.time > 0 ? json(std::max(0.0, now - d.time)) : json()},
                     {"local_world_size", or_null(d.local_world_size)},
                     {"ranks", node_ranks},
                     {"restarts_caused", d.restarts_caused}});
  }
  std::sort(nodes.begin(), nodes.end(), [](const json& a, const json& b) {
    const int ra = a["node_rank"].is_number() ? a["node_rank"].get<int>() : INT32_MAX;
    const int rb = b["node_rank"].is_number() ? b["node_rank"].get<int>() : INT32_MAX;
    return ra != rb ? ra < rb : a["identity"] < b["identity"];
  });
  std::sort(ranks.begin(), ranks.end(), [](const json& a, const json& b) { return a["rank"] < b["rank"]; });
  return json{{"v", 1},
              {"run_id", run_id},
              {"endpoint", endpoint},
              {"state", job_state(r, any_failed, any_running)},
              {"round", r.round >= 0 ? json(r.round) : json()},
              {"restarts", {{"used", used}, {"max", max}}},
              {"time", now},
              {"nodes", nodes},
              {"ranks", ranks},
              {"skipped", r.skipped}};
}

std::string status_table(const json& s) {
  std::ostringstream out;
  out << "job " << s["run_id"].get<std::string>() << " at " << s["endpoint"].get<std::string>() << ": "
      << s["state"].get<std::string>();
  if (s["round"].is_number()) out << ", round " << s["round"].get<int>();
  out << ", restarts " << s["restarts"]["used"].get<int>() << " of " << s["restarts"]["max"].get<int>()
      << ", " << s["nodes"].size() << " node(s), " << s["ranks"].size() << " rank(s), read at "
      << clock_text(s["time"]) << "\n\n";
  std::vector<std::vector<std::string>> rows{
      {"NODE", "HOST", "AGENT PID", "STATE", "HEARTBEAT", "LOCAL", "RANKS", "RESTARTS CAUSED", "DETAIL"}};
  for (const json& n : s["nodes"]) {
    rows.push_back({value_text(n["node_rank"]), value_text(n["host"]), value_text(n["agent_pid"]),
                    value_text(n["state"]), seconds_text(n["heartbeat_age_s"], " ago"),
                    value_text(n["local_world_size"]), rank_ranges(n["ranks"]),
                    value_text(n["restarts_caused"]), value_text(n["detail"])});
  }
  out << columns(rows) << "\n";
  rows = {{"RANK", "NODE", "LOCAL", "HOST", "PID", "STATE", "PROGRESS", "STEP", "STEP TIME",
           "BEFORE COLLECTIVE", "STRAGGLER"}};
  for (const json& r : s["ranks"]) {
    rows.push_back({value_text(r["rank"]), value_text(r["node_rank"]), value_text(r["local_rank"]),
                    value_text(r["host"]), value_text(r["pid"]), value_text(r["state"]),
                    seconds_text(r["progress_age_s"], " ago"), value_text(r["step"]),
                    milliseconds_text(r["step_time_s"]), milliseconds_text(r["before_collective_s"]),
                    r["straggler"] == true    ? "yes"
                    : r["straggler"] == false ? "no"
                                              : "-"});
  }
  out << columns(rows);
  if (s.contains("skipped") && !s["skipped"].empty()) {
    out << "\nskipped, unreadable in the agents' documents (written by something other than a ddprun "
           "agent?):\n";
    for (const json& line : s["skipped"]) out << "  " << value_text(line) << "\n";
  }
  return out.str();
}

}  // namespace ddprun::launcher
