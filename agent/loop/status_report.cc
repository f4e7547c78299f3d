#include "agent/loop/status_report.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "agent/loop/event_queue.h"
#include "agent/watchdog/progress_monitor.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

using json = nlohmann::json;
constexpr std::chrono::seconds kMinGap{1};
constexpr size_t kMaxDetail = 200;

// Seconds since `file` was last written; null when it does not exist.
json age_of(const std::filesystem::path& file) {
  struct stat st {};
  if (file.empty() || ::stat(file.c_str(), &st) != 0) return nullptr;
  const double written = static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec / 1e9;
  return std::max(0.0, unix_now() - written);
}

}  // namespace

void StatusReport::set_state(const std::string& state, const std::string& detail) {
  state_ = state;
  detail_ = detail.size() > kMaxDetail ? detail.substr(0, kMaxDetail) : detail;
  const auto now = Clock::now();
  due_ = last_ && now - *last_ < kMinGap ? *last_ + kMinGap : now;
  if (*due_ <= now) refresh();
}

void StatusReport::refresh() {
  last_ = Clock::now();
  due_ = *last_ + kStatusInterval;
  try {
    rdzv_.publish_status(document());
  } catch (const rdzv::RendezvousError& e) {
    spdlog::debug("cannot publish this agent's status: {}", e.what());
  }
}

std::string StatusReport::document() const {
  json ranks = json::array();
  json round = nullptr, node_rank = nullptr, nodes = nullptr, base_rank = nullptr, world_size = nullptr;
  if (group_) {
    const rdzv::RendezvousInfo& r = group_->round;
    round = r.round;
    node_rank = r.group_rank;
    nodes = r.group_world_size;
    base_rank = r.base_rank;
    world_size = r.world_size;
    for (const Worker& w : group_->workers) {
      if (ranks.size() == kMaxStatusRanks) break;
      json step = nullptr, step_time = nullptr, before_collective = nullptr;
      if (auto beat = read_heartbeat(w.paths.progress_file)) {
        step = beat->step;
        if (beat->step_s) step_time = *beat->step_s;
        if (beat->before_collective_s) before_collective = *beat->before_collective_s;
      }
      ranks.push_back({{"rank", w.rank},
                       {"local_rank", w.local_rank},
                       {"pid", w.pid},
                       {"state", worker_state_name(w.state)},
                       {"progress_age_s", age_of(w.paths.progress_file)},
                       {"step", step},
                       {"step_time_s", step_time},
                       {"before_collective_s", before_collective}});
    }
  }
  const json doc = {{"v", 1},
                    {"host", job_.host},
                    {"pid", ::getpid()},
                    {"backend", config_.rdzv_backend},
                    {"state", state_},
                    {"detail", detail_},
                    {"time", unix_now()},
                    {"round", round},
                    {"node_rank", node_rank},
                    {"nodes", nodes},
                    {"local_world_size", config_.workers.size()},
                    {"base_rank", base_rank},
                    {"world_size", world_size},
                    {"restarts_used", job_.restarts_done},
                    {"restarts_max", config_.supervision.max_restarts},
                    {"restarts_caused", restarts_caused_},
                    {"ranks", ranks}};
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace ddprun::agent
