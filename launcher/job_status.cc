#include "launcher/job_status.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <set>
#include <sstream>

#include "agent/loop/event_queue.h"
#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/round_keys.h"

namespace ddprun::launcher {

namespace {

using json = nlohmann::json;

// A number field of `j`, or `fallback` when it is absent or null.
template <class T>
T number_or(const json& j, const char* field, T fallback) {
  auto it = j.find(field);
  return it != j.end() && it->is_number() ? it->get<T>() : fallback;
}

std::string text_or(const json& j, const char* field, const std::string& fallback = "") {
  auto it = j.find(field);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
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

json read_job_status(rdzv::Store& store, const std::string& run_id, const std::string& endpoint) {
  const rdzv::RoundKeys keys(run_id);
  const std::vector<std::string> identities = keys.status_identities(store);
  if (identities.empty()) {
    throw JobNotFound("no agent of job '" + run_id + "' has published its status at " + endpoint +
                      ": no such --rdzv_id there, or its agents are of a ddprun without `ddprun status`");
  }
  const std::vector<std::string> texts = keys.status_documents(store, identities);
  const bool closed = store.check({keys.key("closed")});
  const double now = agent::unix_now();

  std::vector<json> docs;
  int round = -1;
  for (const auto& text : texts) {
    json d = json::parse(text, nullptr, false);
    if (!d.is_object()) d = json{{"state", "unreadable"}};
    round = std::max(round, number_or(d, "round", -1));
    docs.push_back(std::move(d));
  }
  std::optional<rdzv::RoundStop> stop;
  if (round >= 0 && store.check({keys.round_key(round, "stop")})) {
    stop = rdzv::decode_round_stop(store.get(keys.round_key(round, "stop")));
  }
  // The ranks flagged by the agent of node rank 0 in this round (agent/loop/straggler_watch.h).
  std::set<int> flagged;
  if (auto text = keys.stragglers(store)) {
    const json report = json::parse(*text, nullptr, false);
    if (report.is_object() && number_or(report, "round", -1) == round && report.contains("ranks") &&
        report["ranks"].is_array()) {
      for (const json& r : report["ranks"]) flagged.insert(number_or(r, "rank", -1));
    }
  }

  json nodes = json::array(), ranks = json::array();
  int used = 0, max = 0;
  bool any_failed = false, any_running = false;
  for (size_t i = 0; i < docs.size(); ++i) {
    const json& d = docs[i];
    std::string state = text_or(d, "state", "unknown");
    const bool finished = state == "done" || state == "failed";
    const bool in_round = round >= 0 && number_or(d, "round", -1) == round;
    if (!finished && text_or(d, "backend") == "c10d" && !store.check({keys.key("live/" + identities[i])})) {
      state = "lost";
    } else if (!finished && !in_round && round >= 0 && !closed) {
      state = state == "unhealthy" ? state : "spare";
    }
    any_failed = any_failed || state == "failed";
    any_running = any_running || (in_round && state == "running");
    used = std::max(used, number_or(d, "restarts_used", 0));
    max = std::max(max, number_or(d, "restarts_max", 0));
    json node_ranks = json::array();
    const json node_rank = in_round ? d.value("node_rank", json()) : json();
    if (in_round && d.contains("ranks") && d["ranks"].is_array()) {
      for (const json& r : d["ranks"]) {
        node_ranks.push_back(r.value("rank", -1));
        const json before = r.value("before_collective_s", json());
        ranks.push_back(
            {{"rank", r.value("rank", -1)},
             {"node_rank", node_rank},
             {"local_rank", r.value("local_rank", -1)},
             {"host", text_or(d, "host")},
             {"pid", r.value("pid", json())},
             {"state", r.value("state", json())},
             {"progress_age_s", r.value("progress_age_s", json())},
             {"step", r.value("step", json())},
             {"step_time_s", r.value("step_time_s", json())},
             {"before_collective_s", before},
             {"straggler", before.is_number() ? json(flagged.count(r.value("rank", -1)) > 0) : json()}});
      }
    }
    const double time = number_or(d, "time", 0.0);
    nodes.push_back({{"identity", identities[i]},
                     {"node_rank", node_rank},
                     {"host", text_or(d, "host")},
                     {"agent_pid", d.value("pid", json())},
                     {"state", state},
                     {"detail", text_or(d, "detail")},
                     {"heartbeat_age_s", time > 0 ? json(std::max(0.0, now - time)) : json()},
                     {"local_world_size", d.value("local_world_size", json())},
                     {"ranks", node_ranks},
                     {"restarts_caused", d.value("restarts_caused", 0)}});
  }
  std::sort(nodes.begin(), nodes.end(), [](const json& a, const json& b) {
    const int ra = a["node_rank"].is_number() ? a["node_rank"].get<int>() : INT32_MAX;
    const int rb = b["node_rank"].is_number() ? b["node_rank"].get<int>() : INT32_MAX;
    return ra != rb ? ra < rb : a["identity"] < b["identity"];
  });
  std::sort(ranks.begin(), ranks.end(), [](const json& a, const json& b) { return a["rank"] < b["rank"]; });

  std::string state;
  if (closed || (stop && stop->kind == rdzv::RoundStop::Kind::kDone)) {
    state = any_failed ? "failed" : "done";
  } else if (stop) {
    state = "restarting";
  } else if (any_running) {
    state = "running";
  } else {
    state = "forming";
  }
  return json{{"v", 1},
              {"run_id", run_id},
              {"endpoint", endpoint},
              {"state", state},
              {"round", round >= 0 ? json(round) : json()},
              {"restarts", {{"used", used}, {"max", max}}},
              {"time", now},
              {"nodes", nodes},
              {"ranks", ranks}};
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
  return out.str();
}

}  // namespace ddprun::launcher
