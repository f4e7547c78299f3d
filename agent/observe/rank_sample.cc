#include "agent/observe/rank_sample.h"

#include <sys/stat.h>

#include <algorithm>

#include "rendezvous/util/unix_time.h"

namespace ddprun::agent {

std::vector<RankSample> sample_ranks(const WorkerGroup& group) {
  std::vector<RankSample> samples;
  samples.reserve(group.workers.size());
  const double now = unix_now();
  for (const Worker& w : group.workers) {
    RankSample s;
    struct stat st {};
    const auto& file = w.paths.progress_file;
    if (!file.empty() && ::stat(file.c_str(), &st) == 0) {
      const double written = static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec / 1e9;
      s.age_s = std::max(0.0, now - written);
      s.beat = read_heartbeat(file);
    }
    samples.push_back(std::move(s));
  }
  return samples;
}

}  // namespace ddprun::agent
