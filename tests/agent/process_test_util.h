// Shared by the ProcessContext integration tests (process_context_itest.cc, process_streams_itest.cc,
// process_prestart_itest.cc): an io_context run until a condition, fake workers, fds and FIFOs, exit records.
#pragma once

#include "agent/process/process_context.h"

#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/process/prestart.h"
#include "catch_compat.h"
#include "eventually.h"
#include "temp_dir.h"

namespace process_test {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ddprun::agent::ExitStatus;
using ddprun::agent::ProcessContext;
using ddprun::agent::WorkerLaunch;

inline const std::string kFakeWorker = FAKE_WORKER_PATH;
inline constexpr auto kLimit = 30s;  // bound of every wait; never reached when things work

using ddprun::testing::TempDir;

// Runs io until pred() holds or kLimit passes; returns pred().
inline bool run_until(asio::io_context& io, const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  auto guard = asio::make_work_guard(io);
  io.restart();
  while (!pred()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    io.run_one_for(deadline - now);
  }
  return true;
}

inline WorkerLaunch worker(int local_rank, std::vector<std::string> args) {
  WorkerLaunch w;
  w.local_rank = local_rank;
  w.argv = {kFakeWorker};
  w.argv.insert(w.argv.end(), args.begin(), args.end());
  w.env = {{"PATH", "/usr/bin:/bin"}, {"LOCAL_RANK", std::to_string(local_rank)}};
  return w;
}

inline std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The same text as fake_worker's --print-lines.
inline std::string line_text(const std::string& tag, long i, long line_bytes) {
  std::string line = tag + std::to_string(i) + ":";
  for (long k = 0; static_cast<long>(line.size()) < line_bytes; ++k) line += static_cast<char>('a' + k % 26);
  return line;
}

// Process-group id of pid from /proc/<pid>/stat, -1 if gone.
inline pid_t proc_pgrp(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(stat.substr(paren + 1));
  char state;
  pid_t ppid, pgrp;
  rest >> state >> ppid >> pgrp;
  return rest ? pgrp : -1;
}

inline int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// True once the process behind pidfd has exited (any process, not only our children).
inline bool wait_exited(int pidfd, std::chrono::milliseconds limit) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(limit.count())) == 1;
}

inline std::string readlink_fd(pid_t pid, int fd) {
  std::error_code ec;
  return fs::read_symlink("/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd), ec).string();
}

// A named pipe the test reads while workers write it: a wait for their output without polling files.
class Fifo {
 public:
  explicit Fifo(fs::path path) : path_(std::move(path)) {
    REQUIRE(::mkfifo(path_.c_str(), 0600) == 0);
    read_fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    write_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);  // so that the reader never sees end of file
    REQUIRE(read_fd_ >= 0);
    REQUIRE(write_fd_ >= 0);
  }
  ~Fifo() {
    ::close(read_fd_);
    ::close(write_fd_);
  }
  const fs::path& path() const { return path_; }
  const std::string& data() const { return data_; }

  // Reads until `needle` occurs `count` times in all that was read.
  bool wait_for(const std::string& needle, int count = 1) {
    const auto deadline = std::chrono::steady_clock::now() + kLimit;
    while (occurrences(needle) < count) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return false;
      pollfd p{read_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) != 1) continue;
      char buf[4096];
      const ssize_t n = ::read(read_fd_, buf, sizeof buf);
      if (n > 0) data_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

 private:
  int occurrences(const std::string& needle) const {
    int n = 0;
    for (size_t pos = data_.find(needle); pos != std::string::npos; pos = data_.find(needle, pos + 1)) ++n;
    return n;
  }

  fs::path path_;
  int read_fd_ = -1, write_fd_ = -1;
  std::string data_;
};

// Sends this process's fd 1 or 2 to a file until restore() (no Catch assertion in between).
class CaptureFd {
 public:
  CaptureFd(int fd, const fs::path& file) : fd_(fd) {
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    saved_ = ::dup(fd);
    const int f = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ::dup2(f, fd);
    ::close(f);
  }
  ~CaptureFd() { restore(); }
  void restore() {
    if (saved_ < 0) return;
    std::fflush(nullptr);
    ::dup2(saved_, fd_);
    ::close(saved_);
    saved_ = -1;
  }

 private:
  int fd_;
  int saved_ = -1;
};

struct Exits {
  std::map<int, ExitStatus> status;
  std::map<int, pid_t> pid;
  ProcessContext::ExitFn fn() {
    return [this](int local_rank, pid_t p, ExitStatus s) {
      status[local_rank] = s;
      pid[local_rank] = p;
    };
  }
};


}  // namespace process_test
