#include "tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "ddprun/process_group.h"

namespace ddprun::sdk {
namespace {

constexpr uint64_t kHelloMagic = 0x6464707275524e47ull;  // "ddpruRNG"

struct Hello {
  uint64_t magic;
  uint64_t tag;
  int32_t rank;
  int32_t reserved;
};

[[noreturn]] void sys_fail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

void set_socket_options(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// Waits for `events` on fd or the abort pipe. Returns false at the deadline.
bool wait_fd(int fd, short events, const AbortSignal& abort, const Deadline& deadline) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {abort.fd(), POLLIN, 0}};
    int rc = ::poll(p, 2, std::max(deadline.remaining_ms(), 0));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) sys_fail("poll");
    abort.throw_if_raised();
    return rc > 0 || !deadline.expired();
  }
}

// Reads or writes exactly n bytes of the hello with the deadline; false on EOF/error/deadline.
bool transfer(int fd, void* buf, size_t n, bool write, const AbortSignal& abort, const Deadline& deadline) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = write ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!wait_fd(fd, write ? POLLOUT : POLLIN, abort, deadline) || deadline.expired()) return false;
  }
  return true;
}

}  // namespace

TcpListener::TcpListener() {
  fd_ = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd_) sys_fail("socket");
  int one = 1;
  ::setsockopt(fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) sys_fail("bind 0.0.0.0:0");
  if (::listen(fd_.get(), 128) != 0) sys_fail("listen");
  socklen_t len = sizeof addr;
  if (::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) sys_fail("getsockname");
  port_ = ntohs(addr.sin_port);
}

UniqueFd TcpListener::accept_peer(uint64_t tag, int expected_rank, const AbortSignal& abort,
                                  const Deadline& deadline) {
  for (;;) {
    UniqueFd conn(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) sys_fail("accept");
      if (!wait_fd(fd_.get(), POLLIN, abort, deadline) || deadline.expired()) {
        throw CollectiveError(
            "timed out waiting for rank " + std::to_string(expected_rank) + " to connect (TCP ring)",
            expected_rank);
      }
      continue;
    }
    set_socket_options(conn.get());
    Hello h{};
    if (!transfer(conn.get(), &h, sizeof h, false, abort, deadline)) continue;
    if (h.magic != kHelloMagic || h.tag != tag || h.rank != expected_rank) continue;  // not our peer
    return conn;
  }
}

UniqueFd connect_peer(const std::string& host, uint16_t port, int peer_rank, uint64_t tag, int my_rank,
                      const AbortSignal& abort, const Deadline& deadline) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0 || res == nullptr) {
    throw CollectiveError(
        "cannot resolve " + where + " of rank " + std::to_string(peer_rank) + ": " + ::gai_strerror(gai),
        peer_rank);
  }
  sockaddr_in addr{};
  std::memcpy(&addr, res->ai_addr, sizeof addr);
  ::freeaddrinfo(res);

  std::string last_error = "no attempt";
  int backoff_ms = 10;
  while (!deadline.expired()) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) sys_fail("socket");
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_fd(fd.get(), POLLOUT, abort, deadline) && !deadline.expired()) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      set_socket_options(fd.get());
      Hello h{kHelloMagic, tag, my_rank, 0};
      if (transfer(fd.get(), &h, sizeof h, true, abort, deadline)) return fd;
      last_error = "hello not accepted";
    } else {
      last_error = std::strerror(errno);
    }
    timespec ts{0, backoff_ms * 1'000'000L};
    if (deadline.remaining_ms() > backoff_ms) ::nanosleep(&ts, nullptr);
    backoff_ms = std::min(backoff_ms * 2, 500);
  }
  throw CollectiveError("cannot connect to rank " + std::to_string(peer_rank) + " at " + where + " within " +
                            deadline.elapsed_text() + " (" + last_error + ")",
                        peer_rank);
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
  std::string out;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    // A UDP connect sends nothing; it only picks the route and thus the source address.
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof local;
      char buf[INET_ADDRSTRLEN] = {};
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf) != nullptr) {
        out = buf;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace ddprun::sdk
