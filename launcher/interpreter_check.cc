#include "launcher/interpreter_check.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "agent/process/worker_launch.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::launcher {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxStderr = 65536;
constexpr off_t kCacheRewriteAt = 32 * 1024;  // bytes; then the newest kCacheKeep lines are kept
constexpr size_t kCacheKeep = 256;

// The line of an interpreter's stderr that says why it failed: Python's "Fatal Python error: ..." when
// there is one, else the last non-empty line (a wrapper's own message: "pyenv: version `3.9' is not
// installed", "error while loading shared libraries: ...").
std::string telling_line(const std::string& err) {
  std::string last;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.rfind("Fatal Python error:", 0) == 0) return line;
    if (!line.empty()) last = line;
  }
  return last;
}

bool steers_python(const std::string& name) {
  for (const char* prefix : {"LD_", "PYTHON", "PYENV", "CONDA", "VIRTUAL_ENV"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return name == "PATH";
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

bool cached(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line == key) return true;
  }
  return false;
}

}  // namespace

std::string cache_file(const std::map<std::string, std::string>& env, const std::string& name) {
  auto xdg = env.find("XDG_CACHE_HOME");
  if (xdg != env.end() && !xdg->second.empty() && xdg->second.front() == '/') {
    return xdg->second + "/ddprun/" + name;
  }
  auto home = env.find("HOME");
  if (home != env.end() && !home->second.empty() && home->second.front() == '/') {
    return home->second + "/.cache/ddprun/" + name;
  }
  return "";
}

void remember(const std::string& file, const std::string& line_text) {
  const std::string dir = file.substr(0, file.rfind('/'));
  const std::string parent = dir.substr(0, dir.rfind('/'));
  ::mkdir(parent.c_str(), 0700);  // <cache> (HOME/.cache may not exist yet)
  ::mkdir(dir.c_str(), 0700);
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (fd.get() < 0) return;
  const std::string line = line_text + "\n";
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) return;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_size < kCacheRewriteAt) return;
  fd.reset();
  std::vector<std::string> lines;
  {
    std::ifstream in(file);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  const size_t from = lines.size() > kCacheKeep ? lines.size() - kCacheKeep : 0;
  const std::string tmp = file + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (size_t i = from; i < lines.size(); ++i) out << lines[i] << "\n";
    if (!out.flush()) {
      ::unlink(tmp.c_str());
      return;
    }
  }
  if (::rename(tmp.c_str(), file.c_str()) != 0) ::unlink(tmp.c_str());
}

int run_interpreter(const InterpreterCheck& c, const std::vector<std::string>& args, std::string& err) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return -2 - errno;
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);

  std::vector<std::string> env_strings;
  env_strings.reserve(c.env.size());
  for (const auto& [k, v] : c.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> arg_strings{c.exe};
  arg_strings.insert(arg_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : arg_strings) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Default dispositions and an empty signal mask in the child, whatever the agent blocks or ignores.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int spawn_error = ::posix_spawn(&pid, c.exe.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawn_error != 0) return -2 - spawn_error;
  write_end.reset();

  // Read its stderr until it exits (its pidfd turns readable) or the deadline passes. A descendant that
  // keeps stderr open does not delay the verdict: the interpreter's own exit decides.
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  const auto until = Clock::now() + c.deadline;
  bool exited = false, eof = false;
  auto drain = [&] {
    char buf[4096];
    const ssize_t r = ::read(read_end.get(), buf, sizeof buf);
    if (r > 0 && err.size() < kMaxStderr) err.append(buf, static_cast<size_t>(r));
    if (r == 0) eof = true;
    return r > 0;
  };
  while (!exited) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) break;
    pollfd fds[2];
    nfds_t nfds = 0;
    int pipe_at = -1, pid_at = -1;
    if (!eof) {
      fds[nfds] = {read_end.get(), POLLIN, 0};
      pipe_at = static_cast<int>(nfds++);
    }
    if (pidfd.get() >= 0) {
      fds[nfds] = {pidfd.get(), POLLIN, 0};
      pid_at = static_cast<int>(nfds++);
    }
    // Without a pidfd (Linux < 5.3) the exit is looked at every 5 ms.
    const int timeout = static_cast<int>(pid_at >= 0 ? left : std::min<long long>(left, 5));
    if (::poll(fds, nfds, timeout) < 0 && errno != EINTR) break;
    if (pipe_at >= 0 && fds[pipe_at].revents != 0) drain();
    if (pid_at >= 0) {
      exited = fds[pid_at].revents != 0;
    } else {
      siginfo_t info{};
      exited = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
               info.si_pid == pid;
    }
  }
  if (!exited) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!exited) return -1;
  // What it wrote before it exited is in the pipe now.
  ::fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
  while (!eof && err.size() < kMaxStderr && drain()) {
  }
  return status;
}

std::string interpreter_cache_key(const InterpreterCheck& c) {
  struct stat st {};
  if (::stat(c.exe.c_str(), &st) != 0) return "";
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof host - 1);
  std::ostringstream key;
  key << "v1\n"
      << host << "\n"
      << c.exe << "\n"
      << st.st_dev << " " << st.st_ino << " " << st.st_size << " " << st.st_mtim.tv_sec << "."
      << st.st_mtim.tv_nsec << " " << st.st_ctim.tv_sec << "." << st.st_ctim.tv_nsec << "\n"
      << c.cwd << "\n";
  for (const auto& [k, v] : c.env) {
    if (steers_python(k)) key << k << "=" << v << "\n";
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, fnv1a(key.str()));
  return hex;
}

std::optional<std::string> interpreter_problem(const InterpreterCheck& c) {
  const std::string file = c.use_cache ? cache_file(c.env, "interpreters-ok") : "";
  const std::string key = file.empty() ? "" : interpreter_cache_key(c);
  if (!key.empty() && cached(file, key)) return std::nullopt;

  std::string err;
  const int status = run_interpreter(c, {"-S", "-c", ""}, err);
  const std::string what =
      "ddprun: the interpreter '" + c.shown + "'" + (c.shown == c.exe ? "" : " (" + c.exe + ")");
  const std::string advice = "; fix it, or give another with --python PATH (or DDPRUN_PYTHON)";
  if (status == -1) {
    std::cerr << "ddprun: warning: the interpreter '" << c.shown << "' did not finish `-S -c ''` within "
              << c.deadline.count() << " ms; not checked, going on\n";
    return std::nullopt;
  }
  if (status < -1) {
    const int error = -2 - status;
    if (error == EMFILE || error == ENFILE || error == EAGAIN || error == ENOMEM)
      return std::nullopt;  // ours
    return what + " cannot be executed: " + std::strerror(error) + advice;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    if (!key.empty()) remember(file, key);
    return std::nullopt;
  }
  const std::string how = WIFSIGNALED(status) ? "was killed by " + agent::signal_name(WTERMSIG(status))
                                              : "exited with " + std::to_string(WEXITSTATUS(status));
  const std::string line = telling_line(err);
  return what + " does not run: `" + c.shown + " -S -c ''` " + how + (line.empty() ? "" : ": " + line) +
         advice;
}

}  // namespace ddprun::launcher
