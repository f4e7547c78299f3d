#include "launcher/interpreter_check.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
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

#include "agent/process/run_command.h"
#include "agent/process/worker_launch.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::launcher {

namespace {

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
  agent::CommandRun run{.exe = c.exe, .argv = {c.exe}, .env = c.env, .deadline = c.deadline,
                        .max_output = kMaxStderr};
  run.argv.insert(run.argv.end(), args.begin(), args.end());
  return agent::run_command(run, err);
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
