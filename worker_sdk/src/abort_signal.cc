#include "abort_signal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace ddprun::sdk {

AbortSignal::AbortSignal() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe2");
  read_fd_ = fds[0];
  write_fd_ = fds[1];
}

AbortSignal::~AbortSignal() {
  ::close(read_fd_);
  ::close(write_fd_);
}

bool AbortSignal::raise(const std::string& reason, int peer) {
  {
    std::lock_guard lock(mu_);
    if (raised_.load(std::memory_order_relaxed)) return false;
    reason_ = reason;
    peer_ = peer;
    raised_.store(true, std::memory_order_release);
  }
  char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(write_fd_, &byte, 1);  // the pipe is empty: cannot block or fail
  return true;
}

std::string AbortSignal::reason() const {
  std::lock_guard lock(mu_);
  return reason_;
}

int AbortSignal::peer() const {
  std::lock_guard lock(mu_);
  return peer_;
}

void AbortSignal::throw_if_raised() const {
  if (raised()) throw CollectiveError("aborted: " + reason(), peer());
}

}  // namespace ddprun::sdk
