#include "agent/process/worker_streams.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace ddprun::agent {

namespace {

std::system_error errno_error(const std::string& what) {
  return std::system_error(errno, std::generic_category(), what);
}

UniqueFd open_output_file(const std::filesystem::path& file, const std::string& who) {
  // O_APPEND after O_TRUNC: stdout and stderr sent to one file do not overwrite each other.
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw errno_error(who + ": cannot open '" + file.string() + "' for writing");
  return UniqueFd(fd);
}

}  // namespace

StreamSetup setup_stream(const std::filesystem::path& file, bool console, const std::string& prefix,
                         bool whole_lines, const std::string& who) {
  StreamSetup s;
  if (console && (!file.empty() || !prefix.empty() || whole_lines)) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw errno_error(who + ": cannot create a pipe");
    s.pipe_read.reset(p[0]);
    s.child_fd.reset(p[1]);
    if (!file.empty()) s.tee_file = open_output_file(file, who);
  } else if (!file.empty()) {
    s.child_fd = open_output_file(file, who);
  } else if (!console) {
    s.child_fd.reset(::open("/dev/null", O_WRONLY | O_CLOEXEC));
    if (s.child_fd.get() < 0) throw errno_error(who + ": cannot open /dev/null");
  }
  return s;
}

UniqueFd open_stdin(WorkerLaunch::Stdin mode, const std::string& who) {
  if (mode != WorkerLaunch::Stdin::kNull) return UniqueFd();
  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw errno_error(who + ": cannot open /dev/null");
  return fd;
}

}  // namespace ddprun::agent
