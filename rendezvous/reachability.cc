#include "rendezvous/reachability.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <memory>
#include <vector>

#include "rendezvous/store/store_error.h"
#include "rendezvous/util/text_util.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::rdzv {

namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* p) const { freeaddrinfo(p); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfo resolve(const std::string& host, uint16_t port, int socktype) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return nullptr;
  return AddrInfo(res);
}

Reach probe_one(const addrinfo* a, std::chrono::milliseconds timeout) {
  UniqueFd s{::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol)};
  if (s.get() < 0) return Reach::kSilent;
  if (::connect(s.get(), a->ai_addr, a->ai_addrlen) == 0) return Reach::kOpen;
  if (errno == ECONNREFUSED) return Reach::kRefused;
  if (errno != EINPROGRESS) return Reach::kSilent;  // unreachable network, no route: nothing answers
  pollfd p{.fd = s.get(), .events = POLLOUT, .revents = 0};
  int n;
  do {
    n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return Reach::kSilent;
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err == 0) return Reach::kOpen;
  return err == ECONNREFUSED ? Reach::kRefused : Reach::kSilent;
}

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

}  // namespace

Reach probe_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  AddrInfo res = resolve(host, port, SOCK_STREAM);
  if (!res) return Reach::kRefused;
  Reach result = Reach::kRefused;
  for (const addrinfo* a = res.get(); a; a = a->ai_next) {
    result = probe_one(a, timeout);
    if (result == Reach::kOpen) break;
  }
  return result;
}

std::string source_address_towards(const std::string& host, uint16_t port) {
  AddrInfo res = resolve(host, port, SOCK_DGRAM);
  for (const addrinfo* a = res.get(); a; a = a->ai_next) {
    UniqueFd s{::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0)};
    if (s.get() < 0 || ::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0)
      continue;  // UDP: no packet is sent
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    const void* addr =
        local.ss_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr);
    if (inet_ntop(local.ss_family, addr, buf, sizeof buf)) return buf;
  }
  return "";
}

uint16_t free_tcp_port(const std::string& address) {
  namespace ip = boost::asio::ip;
  boost::asio::io_context io;
  boost::system::error_code ec;
  const ip::address addr =
      address.empty() ? ip::address(ip::address_v4::any()) : ip::make_address(address, ec);
  if (ec) throw BindError("no free port on '" + address + "': not an IP address");
  ip::tcp::acceptor acceptor(io);
  acceptor.open(addr.is_v6() ? ip::tcp::v6() : ip::tcp::v4(), ec);
  if (!ec) acceptor.bind(ip::tcp::endpoint(addr, 0), ec);
  if (ec)
    throw BindError("no free port on " + (address.empty() ? std::string("0.0.0.0") : address) + ": " +
                    ec.message());
  return acceptor.local_endpoint().port();
}

bool is_local_host(const std::string& host) {
  if (host == "localhost" || host == local_hostname()) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  std::vector<std::string> wanted;
  for (auto* p = res; p; p = p->ai_next) {
    std::string a = address_text(p->ai_addr);
    if (a.rfind("127.", 0) == 0 || a == "::1") {
      freeaddrinfo(res);
      return true;
    }
    wanted.push_back(a);
  }
  freeaddrinfo(res);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (auto* i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    std::string a = address_text(i->ifa_addr);
    found = !a.empty() && std::find(wanted.begin(), wanted.end(), a) != wanted.end();
  }
  freeifaddrs(ifs);
  return found;
}

}  // namespace ddprun::rdzv
