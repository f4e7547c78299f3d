#include "agent/log_layout.h"

#include <sys/stat.h>

#include <cerrno>
#include <random>
#include <system_error>

namespace ddprun::agent {

namespace fs = std::filesystem;

LogLayout LogLayout::create(const fs::path& log_dir_given, const std::string& run_id) {
  // An absolute path, as Python >= 3.12's mkdtemp returns (os.path.abspath): the workers'
  // TORCHELASTIC_ERROR_FILE stays right when a worker changes its directory.
  const fs::path log_dir = absolute_log_dir(log_dir_given);
  fs::create_directories(log_dir);
  // Python's tempfile alphabet and name length.
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
  std::random_device seed;
  std::mt19937_64 rng(seed());
  std::uniform_int_distribution<size_t> pick(0, sizeof kAlphabet - 2);
  constexpr int kAttempts = 100;
  for (int i = 0; i < kAttempts; ++i) {
    std::string name = run_id + "_";
    for (int c = 0; c < 8; ++c) name += kAlphabet[pick(rng)];
    const fs::path dir = log_dir / name;
    if (::mkdir(dir.c_str(), 0700) == 0) return LogLayout(dir);
    if (errno != EEXIST) {
      throw fs::filesystem_error("cannot create the log directory", dir,
                                 std::error_code(errno, std::generic_category()));
    }
  }
  throw fs::filesystem_error("cannot find a free log directory name", log_dir / (run_id + "_*"),
                             std::make_error_code(std::errc::file_exists));
}

fs::path LogLayout::attempt_dir(int attempt) const {
  return run_dir_ / ("attempt_" + std::to_string(attempt));
}

WorkerLogPaths LogLayout::worker(int attempt, int local_rank) const {
  WorkerLogPaths p;
  p.local_rank = local_rank;
  p.dir = attempt_dir(attempt) / std::to_string(local_rank);
  p.stdout_file = p.dir / "stdout.log";
  p.stderr_file = p.dir / "stderr.log";
  p.error_file = p.dir / "error.json";
  p.progress_file = p.dir / "progress";
  p.nccl_trace_prefix = p.dir / "nccl_trace_rank_";
  p.nccl_trace_pipe_prefix = p.dir / "nccl_trace_pipe_rank_";
  p.run_dir = run_dir_;
  return p;
}

std::vector<WorkerLogPaths> LogLayout::create_attempt(int attempt, int local_world_size) const {
  const fs::path dir = attempt_dir(attempt);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<WorkerLogPaths> result;
  for (int local_rank = 0; local_rank < local_world_size; ++local_rank) {
    result.push_back(worker(attempt, local_rank));
    fs::create_directory(result.back().dir);
  }
  return result;
}

}  // namespace ddprun::agent
