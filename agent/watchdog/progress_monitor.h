// Hang detection (--hang_timeout): does any local rank still make progress?
//
// Every sampling interval the agent samples each running worker (ProgressSample) and feeds the samples to a
// ProgressTracker. A rank made progress in the interval when any of these grew:
//  - the CPU time of its process group (the worker and every process it started: data loader workers, ...) by
//    at least `min_cpu_share` of the interval (5%: a gloo rank blocked in a collective or a rank sleeping
//    uses well under 1%; torch's own background threads tick a little);
//  - the bytes of its log files (stderr always has one; stdout with -r/-t);
//  - its heartbeats: torch FileTimer requests and the worker SDK's progress file (DDPRUN_PROGRESS_FILE).
// The group is hung when no rank made progress for hang_timeout. What it cannot see: output that goes only to
// the console, work that burns no CPU of the rank's own processes (an NCCL collective spinning on the GPU, a
// rank waiting for a remote file system while its peers wait for it) — docs/cli.md says so.
//
// ProgressTracker is pure (time is passed in) and not thread-safe; sample_progress() reads /proc and the
// file system and never throws (what it cannot read counts as no progress).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace ddprun::agent {

struct ProgressSample {
  double cpu_seconds = 0;     // user + system time of the worker's process group
  uint64_t output_bytes = 0;  // sizes of its log files
  uint64_t heartbeats = 0;    // heartbeat counters (any monotonic number that changes on a heartbeat)
};

class ProgressTracker {
 public:
  using Clock = std::chrono::steady_clock;

  ProgressTracker(std::chrono::milliseconds hang_timeout, Clock::time_point start,
                  double min_cpu_share = 0.05);

  // The samples of every running rank (local rank -> sample) taken at `now`. A rank seen for the first time
  // counts as progress.
  void observe(Clock::time_point now, const std::map<int, ProgressSample>& samples);
  // No rank made progress within hang_timeout before `now`.
  bool hung(Clock::time_point now) const { return now - last_progress_ >= hang_timeout_; }
  Clock::time_point last_progress() const { return last_progress_; }

 private:
  std::chrono::milliseconds hang_timeout_;
  double min_cpu_share_;
  Clock::time_point last_progress_;
  std::optional<Clock::time_point> last_sample_;
  std::map<int, ProgressSample> previous_;
};

// A rank's heartbeat file ($DDPRUN_PROGRESS_FILE, docs/observability.md#the-heartbeat-file): one line
// "<step> [<seconds before the step's first collective> [<step seconds>]]", rewritten every step. A negative
// or absent number is unknown; a file that holds only a step number (a script's own heartbeat) is a step.
struct Heartbeat {
  uint64_t step = 0;
  std::optional<double> before_collective_s;
  std::optional<double> step_s;
};
// nullopt when the file is absent or does not start with a step number.
std::optional<Heartbeat> read_heartbeat(const std::filesystem::path& file);

// The sampling interval for a hang timeout: a tenth of it, between 0.2 s and 5 s.
std::chrono::milliseconds progress_interval(std::chrono::milliseconds hang_timeout);

// CPU seconds (user + system) of every process whose process group is one of `pgids`, summed per group, from
// one scan of /proc. Groups with no readable process are absent.
std::map<pid_t, double> process_group_cpu_seconds(const std::vector<pid_t>& pgids);

// Sum of the sizes of `files` (missing ones count 0), and the modification time of a heartbeat file in
// nanoseconds (0 when missing) — for ProgressSample.
uint64_t total_file_bytes(const std::vector<std::filesystem::path>& files);
uint64_t modification_ns(const std::filesystem::path& file);

}  // namespace ddprun::agent
