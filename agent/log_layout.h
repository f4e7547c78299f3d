// LogLayout: torchrun's --log_dir layout.
//
//   <log_dir>/<run_id>_<8 random chars>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}
//
// As in torchrun 2.6 (DefaultLogsSpecs.reify; 1.13 the same), every rank's directory is created, and a file
// only by whoever writes it: stdout.log / stderr.log by the process context for the streams -r/-t send to a
// file (agent/worker_launches.h decides), error.json by the worker's @record. tests/integration/
// test_pytorch_errors.py compares the trees with torchrun's own.
//
// ddprun adds, only when hang detection or torch's FileTimer is on: <run_dir>/python_hooks/sitecustomize.py
// (agent/watchdog/stack_dump.h), <run_dir>/timer_fifo (agent/watchdog/file_timer.h), each worker's stderr.log
// (its stack dumps are read from it) and heartbeat file attempt_<n>/<local_rank>/progress
// (DDPRUN_PROGRESS_FILE).
//
// The run directory is created once per agent, like torch's tempfile.mkdtemp(prefix=f"{run_id}_",
// dir=log_dir): a fresh name, created exclusively (mode 0700). Each attempt's directory is emptied and
// created again (torch: shutil.rmtree then os.makedirs). The paths themselves are computed without touching
// the file system (worker()).
//
// Errors: std::filesystem::filesystem_error naming the path (unwritable log_dir, ...). Not thread-safe;
// it holds no state beyond the run directory.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::agent {

struct WorkerLogPaths {
  int local_rank = 0;
  std::filesystem::path dir;            // <run_dir>/attempt_<n>/<local_rank>
  std::filesystem::path stdout_file;    // dir/stdout.log
  std::filesystem::path stderr_file;    // dir/stderr.log
  std::filesystem::path error_file;     // dir/error.json (the worker's TORCHELASTIC_ERROR_FILE)
  std::filesystem::path progress_file;  // dir/progress (the worker's DDPRUN_PROGRESS_FILE)
  // torch's NCCL flight recorder, with --hang_timeout: torch appends the global rank to each prefix.
  std::filesystem::path nccl_trace_prefix;  // dir/nccl_trace_rank_ (TORCH_NCCL_DEBUG_INFO_TEMP_FILE)
  std::filesystem::path
      nccl_trace_pipe_prefix;     // dir/nccl_trace_pipe_rank_ (TORCH_NCCL_DEBUG_INFO_PIPE_FILE)
  std::filesystem::path run_dir;  // <run_dir> (for the files the agent shares with every worker)
};

class LogLayout {
 public:
  // Creates log_dir (and parents) if needed, then a new <run_id>_<8 random chars> directory in it. The run
  // directory is absolute (a relative log_dir is taken from the current directory), as torch's with Python
  // >= 3.12 (3.11's mkdtemp kept a relative dir relative).
  static LogLayout create(const std::filesystem::path& log_dir, const std::string& run_id);
  // Uses an existing run directory as is (nothing is created).
  explicit LogLayout(std::filesystem::path run_dir) : run_dir_(std::move(run_dir)) {}

  // The directory create() makes the run directory in: log_dir absolute and normalised (os.path.abspath).
  static std::filesystem::path absolute_log_dir(const std::filesystem::path& log_dir) {
    return std::filesystem::absolute(log_dir).lexically_normal();
  }

  const std::filesystem::path& run_dir() const { return run_dir_; }
  std::filesystem::path attempt_dir(int attempt) const;  // <run_dir>/attempt_<n>
  static std::filesystem::path python_hook_dir(const std::filesystem::path& run_dir) {
    return run_dir / "python_hooks";
  }
  static std::filesystem::path timer_file(const std::filesystem::path& run_dir) {
    return run_dir / "timer_fifo";
  }
  // Pure: the paths of one worker of one attempt.
  WorkerLogPaths worker(int attempt, int local_rank) const;
  // Removes attempt_<n> if it exists, creates it and one directory per local rank 0..local_world_size-1,
  // and returns their paths (index = local rank). The log files are created by whoever writes them.
  std::vector<WorkerLogPaths> create_attempt(int attempt, int local_world_size) const;

 private:
  std::filesystem::path run_dir_;
};

}  // namespace ddprun::agent
