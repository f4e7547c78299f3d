#include "agent/observe/status_report.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rendezvous/util/unix_time.h"
#include "agent/observe/status_document.h"
#include "agent/watchdog/progress_monitor.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

constexpr std::chrono::seconds kMinGap{1};
constexpr size_t kMaxDetail = 200;

// Seconds since `file` was last written; nullopt when it does not exist.
std::optional<double> age_of(const std::filesystem::path& file) {
  struct stat st {};
  if (file.empty() || ::stat(file.c_str(), &st) != 0) return std::nullopt;
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
  StatusDocument d{.host = job_.host,
                   .pid = ::getpid(),
                   .backend = config_.rdzv_backend,
                   .state = state_,
                   .detail = detail_,
                   .time = unix_now(),
                   .local_world_size = static_cast<int>(config_.workers.size()),
                   .restarts_used = job_.restarts_done,
                   .restarts_max = config_.supervision.max_restarts,
                   .restarts_caused = restarts_caused_};
  if (group_) {
    const rdzv::RendezvousInfo& r = group_->round;
    d.round = r.round;
    d.node_rank = r.group_rank;
    d.nodes = r.group_world_size;
    d.base_rank = r.base_rank;
    d.world_size = r.world_size;
    for (const Worker& w : group_->workers) {
      if (d.ranks.size() == kMaxStatusRanks) break;
      RankStatus rank{.rank = w.rank,
                      .local_rank = w.local_rank,
                      .pid = w.pid,
                      .state = worker_state_name(w.state),
                      .progress_age_s = age_of(w.paths.progress_file)};
      if (auto beat = read_heartbeat(w.paths.progress_file)) {
        rank.step = beat->step;
        rank.step_time_s = beat->step_s;
        rank.before_collective_s = beat->before_collective_s;
      }
      d.ranks.push_back(std::move(rank));
    }
  }
  return status_document_text(d);
}

}  // namespace ddprun::agent
