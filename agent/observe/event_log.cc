#include "agent/observe/event_log.h"

#include <string.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddprun::agent {

namespace {

using Json = nlohmann::ordered_json;  // keeps the keys in insertion order, as a Python dict does

template <typename T>
Json or_null(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

}  // namespace

std::string python_dumps(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case Json::value_t::object: {
      std::string out = "{";
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (it != j.begin()) out += ", ";
        out += python_dumps(Json(it.key())) + ": " + python_dumps(it.value());
      }
      return out + "}";
    }
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + python_dumps(j[i]);
      return out + "]";
    }
    default:
      return j.dump(-1, ' ', true, Json::error_handler_t::replace);
  }
}

bool events_printed(EventLogHandler handler, const char* loglevel) {
  if (handler != EventLogHandler::kConsole) return false;
  if (!loglevel) return true;
  for (const char* hiding : {"WARN", "WARNING", "ERROR", "CRITICAL", "FATAL", "NOTSET"}) {
    if (strcmp(loglevel, hiding) == 0) return false;
  }
  return true;
}

std::string status_event_json(const StatusEvent& e) {
  Json md;
  md["group_world_size"] = or_null(e.group_world_size);
  md["entry_point"] = e.entry_point;
  if (e.worker) {
    md["local_rank"] = Json::array({e.worker->local_rank});
    md["role_rank"] = Json::array({e.worker->role_rank});
    md["role_world_size"] = Json::array({e.worker->role_world_size});
    md["exit_code"] = Json::array({or_null(e.worker->exit_code)});
    md["worker_pid"] = Json::array({or_null(e.worker->worker_pid)});
  }
  Json metadata;
  metadata["run_id"] = e.run_id;
  metadata["global_rank"] = e.worker ? Json(e.worker->global_rank) : Json(nullptr);
  metadata["group_rank"] = or_null(e.group_rank);
  metadata["worker_id"] = e.worker ? Json(std::to_string(e.worker->worker_id)) : Json(nullptr);
  metadata["role"] = e.role;
  metadata["hostname"] = e.hostname;
  metadata["state"] = e.state;
  metadata["total_run_time"] = e.total_run_time;
  metadata["rdzv_backend"] = e.rdzv_backend;
  metadata["raw_error"] = or_null(e.raw_error);
  metadata["metadata"] = python_dumps(md);
  metadata["agent_restarts"] = e.agent_restarts;
  metadata["duration_ms"] = or_null(e.duration_ms);
  Json event;
  event["name"] = "torchelastic.worker.status." + e.state;
  event["source"] = e.from_worker ? "WORKER" : "AGENT";
  event["timestamp"] = 0;
  event["metadata"] = std::move(metadata);
  return python_dumps(event);
}

std::string error_file_json(const std::filesystem::path& error_file) {
  std::ifstream in(error_file);
  if (in) {
    std::stringstream text;
    text << in.rdbuf();
    Json data = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!data.is_discarded()) return python_dumps(data);
  }
  return python_dumps(Json{{"message", "<NONE>"}});
}

}  // namespace ddprun::agent
