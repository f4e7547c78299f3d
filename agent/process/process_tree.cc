#include "agent/process/process_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "rendezvous/util/text_util.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {
namespace {

// A pid, process group or session id of /proc: the whole of `text`, within pid_t.
bool parse_int(std::string_view text, pid_t& out) {
  const auto v = parse_int_in<pid_t>(text, INT32_MIN, INT32_MAX);
  if (v) out = *v;
  return v.has_value();
}

}  // namespace

std::optional<ProcStat> parse_proc_stat(std::string_view text) {
  const size_t open = text.find('(');
  const size_t close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
  ProcStat s;
  std::string_view pid = text.substr(0, open);
  while (!pid.empty() && pid.back() == ' ') pid.remove_suffix(1);
  if (!parse_int(pid, s.pid)) return std::nullopt;
  // After ") ": state ppid pgrp session ...
  std::string_view rest = text.substr(close + 1);
  std::string_view fields[4];
  for (auto& field : fields) {
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    const size_t end = std::min(rest.find(' '), rest.size());
    field = rest.substr(0, end);
    rest.remove_prefix(end);
  }
  if (fields[0].size() != 1 || !parse_int(fields[1], s.ppid) || !parse_int(fields[2], s.pgrp) ||
      !parse_int(fields[3], s.session)) {
    return std::nullopt;
  }
  s.state = fields[0][0];
  return s;
}

std::vector<pid_t> descendants(const std::vector<ProcStat>& table, pid_t root, pid_t skip) {
  std::map<pid_t, pid_t> parent;
  for (const ProcStat& s : table) parent[s.pid] = s.ppid;
  std::vector<pid_t> result;
  for (const ProcStat& s : table) {
    if (s.pid == root) continue;
    pid_t p = s.pid;
    bool reached = false;
    for (size_t steps = 0; steps <= table.size() && p > 0 && p != skip; ++steps) {
      auto it = parent.find(p);
      if (it == parent.end()) break;
      p = it->second;
      if (p == root) {
        reached = true;
        break;
      }
    }
    if (reached) result.push_back(s.pid);
  }
  std::sort(result.begin(), result.end());
  return result;
}

std::vector<ProcStat> read_process_table() {
  std::vector<ProcStat> table;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return table;
  while (const dirent* entry = ::readdir(dir)) {
    pid_t pid;
    if (!parse_int(entry->d_name, pid)) continue;
    std::ifstream in(std::string("/proc/") + entry->d_name + "/stat");
    std::stringstream text;
    text << in.rdbuf();
    if (auto s = parse_proc_stat(text.str())) table.push_back(*s);
  }
  ::closedir(dir);
  return table;
}

bool kill_descendants(pid_t skip, std::chrono::steady_clock::time_point deadline) {
  const pid_t self = ::getpid();
  while (std::chrono::steady_clock::now() < deadline) {
    const auto table = read_process_table();
    const auto tree = descendants(table, self, skip);
    std::vector<UniqueFd> pidfds;
    std::vector<pollfd> waits;
    std::vector<pid_t> zombie_children;
    for (const ProcStat& s : table) {
      if (!std::binary_search(tree.begin(), tree.end(), s.pid)) continue;
      if (s.state == 'Z') {
        // Its parent is in the tree too, and dies in this round; then it is re-parented to us.
        if (s.ppid == self) zombie_children.push_back(s.pid);
        continue;
      }
      UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, s.pid, 0)));
      if (fd.get() < 0) continue;  // gone already
      ::syscall(SYS_pidfd_send_signal, fd.get(), SIGKILL, nullptr, 0);
      waits.push_back(pollfd{fd.get(), POLLIN, 0});
      pidfds.push_back(std::move(fd));
    }
    for (pid_t pid : zombie_children) ::waitpid(pid, nullptr, WNOHANG);
    if (waits.empty() && zombie_children.empty()) return true;
    // A pidfd turns readable once its process has exited; then the next round reaps it.
    while (std::any_of(waits.begin(), waits.end(), [](const pollfd& p) { return p.fd >= 0; })) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      if (::poll(waits.data(), waits.size(), static_cast<int>(left.count())) < 0 && errno != EINTR)
        return false;
      for (auto& p : waits) {
        if (p.revents != 0) p.fd = -1;  // poll skips negative fds
      }
    }
  }
  return false;
}

}  // namespace ddprun::agent
