#include "agent/loop/progress_sampler.h"

#include <map>
#include <vector>

namespace ddprun::agent {

ProgressSampler::ProgressSampler(std::chrono::milliseconds hang_timeout)
    : hang_timeout_(hang_timeout), tracker_(hang_timeout, Clock::now()) {
  if (hang_timeout.count() > 0) next_ = Clock::now();
}

std::optional<ProgressSampler::Clock::time_point> ProgressSampler::next(const WorkerGroup& group) {
  if (group.state != GroupState::kHealthy) next_.reset();
  return next_;
}

bool ProgressSampler::sample(const WorkerGroup& group, uint64_t timer_requests) {
  std::vector<pid_t> pgids;
  for (const Worker& w : group.workers) {
    if (w.state == WorkerState::kHealthy && w.pid > 0) pgids.push_back(w.pid);  // pid == its group id
  }
  const auto cpu = process_group_cpu_seconds(pgids);
  std::map<int, ProgressSample> samples;
  for (const Worker& w : group.workers) {
    if (w.state != WorkerState::kHealthy || w.pid <= 0) continue;
    auto c = cpu.find(w.pid);
    samples[w.local_rank] =
        ProgressSample{.cpu_seconds = c == cpu.end() ? 0.0 : c->second,
                       .output_bytes = total_file_bytes({w.launch.stdout_file, w.launch.stderr_file}),
                       .heartbeats = modification_ns(w.paths.progress_file) + timer_requests};
  }
  tracker_.observe(Clock::now(), samples);
  next_ = Clock::now() + progress_interval(hang_timeout_);
  return tracker_.hung(Clock::now());
}

}  // namespace ddprun::agent
