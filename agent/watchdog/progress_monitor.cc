#include "agent/watchdog/progress_monitor.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace ddprun::agent {

ProgressTracker::ProgressTracker(std::chrono::milliseconds hang_timeout, Clock::time_point start,
                                 double min_cpu_share)
    : hang_timeout_(hang_timeout), min_cpu_share_(min_cpu_share), last_progress_(start) {}

void ProgressTracker::observe(Clock::time_point now, const std::map<int, ProgressSample>& samples) {
  const double interval = last_sample_ ? std::chrono::duration<double>(now - *last_sample_).count() : 0.0;
  bool progress = false;
  for (const auto& [rank, s] : samples) {
    auto before = previous_.find(rank);
    if (before == previous_.end()) {
      progress = true;  // a new worker: it has just started
      continue;
    }
    const ProgressSample& p = before->second;
    if (s.output_bytes != p.output_bytes || s.heartbeats != p.heartbeats ||
        s.cpu_seconds - p.cpu_seconds >= min_cpu_share_ * interval) {
      progress = true;
    }
  }
  if (progress) last_progress_ = now;
  previous_ = samples;
  last_sample_ = now;
}

std::optional<Heartbeat> read_heartbeat(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  std::istringstream fields(line);
  unsigned long long step = 0;
  if (!(fields >> step)) return std::nullopt;
  Heartbeat beat{.step = static_cast<uint64_t>(step)};
  double seconds = 0;
  if (fields >> seconds && seconds >= 0) beat.before_collective_s = seconds;
  if (fields >> seconds && seconds >= 0) beat.step_s = seconds;
  return beat;
}

std::chrono::milliseconds progress_interval(std::chrono::milliseconds hang_timeout) {
  return std::clamp(hang_timeout / 10, std::chrono::milliseconds(200), std::chrono::milliseconds(5000));
}

std::map<pid_t, double> process_group_cpu_seconds(const std::vector<pid_t>& pgids) {
  std::map<pid_t, double> out;
  const std::set<pid_t> wanted(pgids.begin(), pgids.end());
  const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Fields after "(comm)", which may itself hold spaces and parentheses: state ppid pgrp ... utime(14)
    // stime(15).
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string state;
    long ppid = 0, pgrp = 0;
    fields >> state >> ppid >> pgrp;
    if (!fields || !wanted.count(static_cast<pid_t>(pgrp))) continue;
    std::string skip;
    for (int i = 6; i <= 13; ++i) fields >> skip;
    unsigned long long utime = 0, stime = 0;
    if (fields >> utime >> stime)
      out[static_cast<pid_t>(pgrp)] += static_cast<double>(utime + stime) / ticks_per_second;
  }
  closedir(proc);
  return out;
}

uint64_t total_file_bytes(const std::vector<std::filesystem::path>& files) {
  uint64_t total = 0;
  for (const auto& f : files) {
    struct stat st {};
    if (!f.empty() && ::stat(f.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  return total;
}

uint64_t modification_ns(const std::filesystem::path& file) {
  struct stat st {};
  if (file.empty() || ::stat(file.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ULL + static_cast<uint64_t>(st.st_mtim.tv_nsec);
}

}  // namespace ddprun::agent
