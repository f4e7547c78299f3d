#include "agent/process/worker_launch.h"

#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <system_error>

namespace ddprun::agent {

namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string signal_name(int sig) {
  // Linux's signal names by number, as glibc's sigabbrev_np gives them (which needs glibc 2.32: the release
  // runs on 2.31). Real-time signals have no name there either.
  static constexpr std::array<const char*, 32> kNames = {
      nullptr, "HUP",  "INT",  "QUIT", "ILL",    "TRAP",   "ABRT",  "BUS",  "FPE",  "KILL", "USR1",
      "SEGV",  "USR2", "PIPE", "ALRM", "TERM",   "STKFLT", "CHLD",  "CONT", "STOP", "TSTP", "TTIN",
      "TTOU",  "URG",  "XCPU", "XFSZ", "VTALRM", "PROF",   "WINCH", "POLL", "PWR",  "SYS"};
  const bool named = sig > 0 && sig < static_cast<int>(kNames.size());
  return named ? "SIG" + std::string(kNames[static_cast<size_t>(sig)]) : std::to_string(sig);
}

std::string find_program(const std::string& name, const std::map<std::string, std::string>& env,
                         const std::string& who) {
  if (name.empty()) throw std::invalid_argument(who + ": argv[0] is empty");
  if (name.find('/') != std::string::npos) {
    if (!is_executable_file(name)) {
      if (::access(name.c_str(), X_OK) == 0) errno = EACCES;  // a directory
      throw std::system_error(errno, std::generic_category(), who + ": cannot execute '" + name + "'");
    }
    return name;
  }
  std::string path;
  if (auto it = env.find("PATH"); it != env.end()) {
    path = it->second;
  } else if (const char* p = std::getenv("PATH")) {
    path = p;
  } else {
    path = "/usr/local/bin:/usr/bin:/bin";
  }
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = path.substr(begin, end - begin);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    begin = end + 1;
  }
  throw std::system_error(ENOENT, std::generic_category(),
                          who + ": program '" + name + "' not found in PATH=" + path);
}

std::string ExitStatus::describe() const {
  if (signal == 0) return "exit code " + std::to_string(exit_code);
  return "signal " + signal_name(signal) + " (" + std::to_string(signal) + ")";
}

}  // namespace ddprun::agent
