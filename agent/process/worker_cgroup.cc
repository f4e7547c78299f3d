#include "agent/process/worker_cgroup.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <vector>

#include "agent/process/spawn.h"

namespace ddprun::agent {
namespace {

std::string read_text(const char* file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A mountinfo field with its octal escapes (\040 for a space) decoded.
std::string unescape(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string_view digits = field.substr(i + 1, 3);
      if (digits.size() == 3 && digits.find_first_not_of("01234567") == std::string_view::npos) {
        out += static_cast<char>((digits[0] - '0') * 64 + (digits[1] - '0') * 8 + (digits[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

// --- async-signal-safe helpers (no allocation): also run by the guard process ---

// dir + "/" + file into out (PATH_MAX); false when it does not fit.
bool join(char (&out)[4096], const char* dir, const char* file) {
  const size_t d = ::strlen(dir), f = ::strlen(file);
  if (d + 1 + f + 1 > sizeof out) return false;
  ::memcpy(out, dir, d);
  out[d] = '/';
  ::memcpy(out + d + 1, file, f + 1);
  return true;
}

long now_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

// SIGKILL each pid listed in cgroup.procs; true when it listed none.
bool kill_listed(const char* procs_path) {
  const int fd = ::open(procs_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  bool none = true;
  char buf[4096];
  long pid = 0;
  bool in_number = false;
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
        in_number = true;
      } else if (in_number) {
        ::kill(static_cast<pid_t>(pid), SIGKILL);
        none = false;
        pid = 0;
        in_number = false;
      }
    }
  }
  if (in_number) {
    ::kill(static_cast<pid_t>(pid), SIGKILL);
    none = false;
  }
  ::close(fd);
  return none;
}

// "populated 0" in cgroup.events (an unreadable file counts as empty: the cgroup is gone).
bool unpopulated(int events_fd) {
  char buf[512];
  const ssize_t n = ::pread(events_fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* p = ::strstr(buf, "populated ");
  return p == nullptr || p[10] == '0';
}

bool kill_cgroup(const char* dir, int timeout_ms) {
  char kill_path[4096], procs_path[4096], events_path[4096];
  if (!join(kill_path, dir, "cgroup.kill") || !join(procs_path, dir, "cgroup.procs") ||
      !join(events_path, dir, "cgroup.events")) {
    return false;
  }
  bool have_kill = false;
  const int kill_fd = ::open(kill_path, O_WRONLY | O_CLOEXEC);
  if (kill_fd >= 0) {
    have_kill = ::write(kill_fd, "1", 1) == 1;
    ::close(kill_fd);
  }
  const int events_fd = ::open(events_path, O_RDONLY | O_CLOEXEC);
  if (events_fd < 0) return true;  // no such cgroup (any more)
  const long deadline = now_ms() + timeout_ms;
  bool empty = false;
  while (true) {
    // Without cgroup.kill (Linux < 5.14) a process may fork between the read and the kill: repeat until the
    // list is empty.
    if (!have_kill) kill_listed(procs_path);
    if (unpopulated(events_fd)) {
      empty = true;
      break;
    }
    const long left = deadline - now_ms();
    if (left <= 0) break;
    // cgroup.events signals every change of "populated" as POLLPRI.
    pollfd p{events_fd, POLLPRI, 0};
    ::poll(&p, 1, static_cast<int>(have_kill ? left : (left < 10 ? left : 10)));
  }
  ::close(events_fd);
  return empty;
}

}  // namespace

bool kill_cgroup_and_remove(const char* dir, int timeout_ms) {
  const bool empty = kill_cgroup(dir, timeout_ms);
  return empty && (::rmdir(dir) == 0 || errno == ENOENT);
}

std::optional<std::string> cgroup2_path(std::string_view proc_cgroup) {
  size_t begin = 0;
  while (begin < proc_cgroup.size()) {
    size_t end = proc_cgroup.find('\n', begin);
    if (end == std::string_view::npos) end = proc_cgroup.size();
    const std::string_view line = proc_cgroup.substr(begin, end - begin);
    if (line.starts_with("0::")) return std::string(line.substr(3));
    begin = end + 1;
  }
  return std::nullopt;
}

std::optional<std::filesystem::path> cgroup2_directory(std::string_view mountinfo, const std::string& path) {
  std::optional<std::filesystem::path> best;
  size_t best_root = 0;
  std::istringstream lines{std::string(mountinfo)};
  std::string line;
  while (std::getline(lines, line)) {
    // id parent major:minor root mount-point options [optional fields] - fstype source super-options
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string id, parent, device, root, mount_point;
    if (!(fields >> id >> parent >> device >> root >> mount_point)) continue;
    root = unescape(root);
    mount_point = unescape(mount_point);
    const bool inside = root == "/" || path == root || (path.starts_with(root) && path[root.size()] == '/');
    if (!inside || (best && root.size() <= best_root)) continue;
    const std::string rest = root == "/" ? path : path.substr(root.size());
    best = std::filesystem::path(mount_point) / std::filesystem::path(rest).relative_path();
    best_root = root.size();
  }
  if (best) *best = best->lexically_normal();
  if (best && best->string().size() > 1 && best->string().ends_with('/')) *best = best->parent_path();
  return best;
}

std::unique_ptr<WorkerCgroup> WorkerCgroup::create() {
  const auto own = cgroup2_path(read_text("/proc/self/cgroup"));
  if (!own) {
    spdlog::debug("no cgroup v2 for the workers: /proc/self/cgroup has no 0:: line");
    return nullptr;
  }
  const auto parent = cgroup2_directory(read_text("/proc/self/mountinfo"), *own);
  if (!parent) {
    spdlog::debug("no cgroup v2 for the workers: no cgroup2 mount shows {}", *own);
    return nullptr;
  }
  std::filesystem::path dir;
  for (int attempt = 0;; ++attempt) {
    dir = *parent / ("ddprun-" + std::to_string(::getpid()) + (attempt ? "-" + std::to_string(attempt) : ""));
    if (::mkdir(dir.c_str(), 0755) == 0) break;
    if (errno != EEXIST || attempt == 9) {
      spdlog::debug("no cgroup v2 for the workers: mkdir {}: {}", dir.string(), strerror(errno));
      return nullptr;
    }
  }
  UniqueFd procs(::open((dir / "cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  // Starting a process there needs write access to the common ancestor's cgroup.procs too: a child tries.
  if (procs.get() < 0 || dir_fd.get() < 0 || !child_can_join_cgroup(dir_fd.get(), procs.get())) {
    spdlog::debug("no cgroup v2 for the workers: a child cannot join {}", dir.string());
    ::rmdir(dir.c_str());
    return nullptr;
  }
  return std::unique_ptr<WorkerCgroup>(new WorkerCgroup(std::move(dir), std::move(dir_fd), std::move(procs)));
}

WorkerCgroup::~WorkerCgroup() {
  if (!kill_cgroup_and_remove(path_.c_str(), 10000)) {
    spdlog::warn("could not empty and remove the workers' cgroup {}", path_.string());
  }
}

bool WorkerCgroup::kill_all(std::chrono::steady_clock::time_point deadline) const {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return kill_cgroup(path_.c_str(), static_cast<int>(std::max<long>(0, left.count())));
}

}  // namespace ddprun::agent
