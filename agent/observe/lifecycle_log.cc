#include "agent/observe/lifecycle_log.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <system_error>
#include <utility>

#include "rendezvous/util/unix_time.h"

namespace ddprun::agent {

void LifecycleLog::open(const std::filesystem::path& file, std::string run_id, std::string host) {
  file_ = file;
  run_id_ = std::move(run_id);
  host_ = std::move(host);
  // Non-blocking: a FIFO without a reader fails at once (ENXIO) instead of holding up the agent's start, and
  // a reader that stops reading costs events, never the agent loop.
  fd_ = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd_ < 0) {
    const int error = errno;
    throw std::system_error(
        error, std::generic_category(),
        "cannot open the event log " + file.string() + " (--event_log_handler file:PATH" +
            (error == ENXIO ? "; it is a FIFO with no reader: start its reader first)" : ")"));
  }
  struct stat st {};
  fifo_ = ::fstat(fd_, &st) == 0 && S_ISFIFO(st.st_mode);
}

LifecycleLog::~LifecycleLog() {
  if (fd_ >= 0) ::close(fd_);
}

void LifecycleLog::record(const std::string& event, const EventFields& fields) {
  if (fd_ < 0) return;
  EventFields line = {{"v", 1},
                      {"time", unix_now()},
                      {"event", event},
                      {"run_id", run_id_},
                      {"host", host_},
                      {"agent_pid", ::getpid()},
                      {"round", round_ >= 0 ? EventFields(round_) : EventFields()}};
  for (const auto& [k, v] : fields.items()) line[k] = v;
  const std::string text = line.dump(-1, ' ', false, EventFields::error_handler_t::replace) + "\n";
  if (const int error = write_line(text); error != 0) drop(error);
}

// One whole line: the rest of a short write follows (a pipe takes a long line in pieces), EINTR is retried.
// On a pipe, a line that does not fit in the room left is dropped before a byte of it is written (EAGAIN), so
// that no half line is ever left behind a later one; a line under way gets kLineFinish to go through. Returns
// 0 or an errno.
int LifecycleLog::write_line(const std::string& text) {
  if (fifo_) {
    int queued = 0;
    const int capacity = ::fcntl(fd_, F_GETPIPE_SZ);
    if (capacity > 0 && ::ioctl(fd_, FIONREAD, &queued) == 0 &&
        text.size() > static_cast<size_t>(capacity - queued))
      return EAGAIN;
  }
  size_t done = 0;
  const auto finish_by = std::chrono::steady_clock::now() + kLineFinish;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int error = n < 0 ? errno : EIO;
    if (error != EAGAIN || done == 0 || std::chrono::steady_clock::now() >= finish_by) return error;
    pollfd p{.fd = fd_, .events = POLLOUT, .revents = 0};
    ::poll(&p, 1, 10);
  }
  return 0;
}

// An event that could not be written is dropped; the log stays on (a reader may come back, a full disk may
// get room). Said at most once a minute, with the count.
void LifecycleLog::drop(int error) {
  ++dropped_;
  const auto now = std::chrono::steady_clock::now();
  if (last_complaint_ && now - *last_complaint_ < std::chrono::minutes(1)) return;
  last_complaint_ = now;
  spdlog::error("cannot write the event log {}: {}; {} event(s) dropped so far (the log stays on)",
                file_.string(), std::error_code(error, std::generic_category()).message(), dropped_);
}

}  // namespace ddprun::agent
