// UniqueFd: sole owner of one file descriptor (every component's: the agent's pipes and pidfds, the
// launcher's, the rendezvous' probes, the SDK's sockets); closes it on destruction or reset. Movable, not
// copyable. -1 means none. Not thread-safe (like the int it wraps). close(2) errors are ignored.
#pragma once

#include <unistd.h>

#include <utility>

namespace ddprun {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  // Gives up ownership: returns the fd, which the caller must close.
  int release() { return std::exchange(fd_, -1); }
  // Closes the fd owned so far (if any) and owns `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace ddprun
