#include "agent/watchdog/stack_capture.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

extern char** environ;

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

off_t size_of(const std::filesystem::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? st.st_size : 0;
}

std::string read_from(const std::filesystem::path& p, off_t offset) {
  std::ifstream in(p, std::ios::binary);
  in.seekg(offset);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Runs gdb on `pid` with its output appended to `log`; kills it after `limit`. False when gdb could not run.
bool run_gdb(pid_t pid, const std::filesystem::path& log, std::chrono::milliseconds limit) {
  int fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fd, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  const std::string p = std::to_string(pid);
  std::vector<std::string> args{
      "gdb", "-p", p, "-batch", "-nx", "-ex", "set pagination off", "-ex", "thread apply all bt"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  const bool started = posix_spawnp(&child, "gdb", &actions, nullptr, argv.data(), environ) == 0;
  posix_spawn_file_actions_destroy(&actions);
  ::close(fd);
  if (!started) return false;
  const auto deadline = Clock::now() + limit;
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(20ms);  // a child of our own with a deadline: no event to await here
  }
  return true;
}

bool have_gdb() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string d; std::getline(dirs, d, ':');) {
    if (!d.empty() && ::access((std::filesystem::path(d) / "gdb").c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

bool catches_signal(pid_t pid, int sig) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
    return sig >= 1 && sig <= 64 && (mask >> (sig - 1) & 1ULL);
  }
  return false;
}

std::map<int, Stack> capture_stacks(const std::vector<StackTarget>& targets, int python_signal,
                                    std::chrono::milliseconds wait) {
  std::map<int, Stack> stacks;
  std::vector<std::pair<const StackTarget*, off_t>> asked;  // Python workers signalled, from where to read
  std::vector<const StackTarget*> native;
  for (const auto& t : targets) {
    if (!t.nccl_dump_pipe.empty()) {
      int fd =
          ::open(t.nccl_dump_pipe.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // fails unless torch listens
      if (fd >= 0) {
        if (::write(fd, "1", 1) == 1)
          spdlog::info("asked rank {} for its NCCL flight-recorder trace", t.rank);
        ::close(fd);
      }
    }
    const off_t before = size_of(t.stderr_log);  // before the signal: the dump may land at once
    if (catches_signal(t.pid, python_signal) && ::kill(t.pid, python_signal) == 0) {
      asked.emplace_back(&t, before);
    } else {
      native.push_back(&t);
    }
  }
  // faulthandler writes from inside the signal handler; the agent's output pump copies it into the log.
  const auto deadline = Clock::now() + wait;
  std::map<const StackTarget*, off_t> last_size;
  while (!asked.empty()) {
    for (auto it = asked.begin(); it != asked.end();) {
      // Complete once a stack is there and the log stopped growing since the last look.
      const off_t size = size_of(it->first->stderr_log);
      Stack s = parse_stack_dump(read_from(it->first->stderr_log, it->second));
      const bool stable = std::exchange(last_size[it->first], size) == size;
      if (!s.empty() && stable) {
        stacks[it->first->rank] = std::move(s);
        it = asked.erase(it);
      } else {
        ++it;
      }
    }
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(50ms);  // waiting for a file another process writes
  }
  for (const auto& [t, offset] : asked) stacks[t->rank] = parse_stack_dump(read_from(t->stderr_log, offset));
  const bool gdb = !native.empty() && have_gdb();
  for (const StackTarget* t : native) {
    const off_t offset = size_of(t->stderr_log);
    if (gdb && run_gdb(t->pid, t->stderr_log, 15s))
      stacks[t->rank] = parse_stack_dump(read_from(t->stderr_log, offset));
  }
  return stacks;
}

}  // namespace ddprun::agent
