#include "agent/state/state_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "rendezvous/util/state_format.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

using Kind = StateMessage::Kind;
constexpr std::chrono::milliseconds kIdle{30000};

// A listening socket on `host` ("" = every interface, IPv6 and IPv4), port 0.
UniqueFd listen_on(const std::string& host, uint16_t& port) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET6;
  if (host.empty() || host == "::") {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    len = sizeof *a;
  } else if (in6_addr a6{}; ::inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_addr = a6;
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    if (::inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1)
      return listen_on("", port);  // a name: everywhere
    len = sizeof *a;
    family = AF_INET;
  }
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd && family == AF_INET6 && host.empty()) return listen_on("0.0.0.0", port);  // no IPv6 here
  if (!fd) throw std::system_error(errno, std::generic_category(), "state server: socket");
  const int zero = 0, one = 1;
  if (family == AF_INET6) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd.get(), 64) != 0) {
    throw std::system_error(
        errno, std::generic_category(),
        "state server: cannot listen on " + (host.empty() ? std::string("every interface") : host));
  }
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                  : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

std::string peer_name(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  } else if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  }
  std::string name = host;
  if (name.starts_with("::ffff:")) name.erase(0, 7);
  return name + ":" + std::to_string(port);
}

}  // namespace

StateServer::StateServer(const StateDirectory& dir, const std::string& bind_host,
                         std::shared_ptr<const rdzv::StoreAuth> auth, uint64_t replica_bytes)
    : dir_(dir), auth_(std::move(auth)), replica_bytes_(replica_bytes) {
  listener_ = listen_on(bind_host, port_);
  stop_.reset(::eventfd(0, EFD_CLOEXEC));
  if (!stop_) throw std::system_error(errno, std::generic_category(), "state server: eventfd");
  acceptor_ = std::thread([this] { accept_loop(); });
}

StateServer::~StateServer() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(stop_.get(), &one, sizeof one);
  acceptor_.join();
  std::list<Peer> peers;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (Peer& p : peers_) p.connection->interrupt();
    peers.splice(peers.end(), peers_);
  }
  for (Peer& p : peers) p.thread.join();
}

StateServer::Counters StateServer::counters() const {
  return {copies_.load(), bytes_.load(), served_.load()};
}

void StateServer::reap_finished() {
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (it->done) {
      it->thread.join();
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
}

void StateServer::accept_loop() {
  while (true) {
    pollfd fds[2] = {{stop_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    if (fds[1].revents == 0) continue;
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    UniqueFd fd(::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC));
    if (!fd) continue;
    std::lock_guard lock(mu_);
    reap_finished();
    if (stopping_ || peers_.size() >= kMaxConnections) continue;  // closed at once
    Peer& p = peers_.emplace_back();
    p.connection = std::make_shared<StateConnection>(std::move(fd), peer_name(addr), kIdle);
    p.thread = std::thread([this, &p] {
      try {
        serve(*p.connection);
      } catch (const StateTransferError& e) {
        // The sender says what went wrong on its side (it may have given up on purpose: it stops).
        spdlog::debug("training state: {}", e.what());
      }
      p.done = true;
    });
  }
}

void StateServer::serve(StateConnection& c) {
  std::string why;
  if (!c.server_handshake(auth_.get(), why)) {
    spdlog::warn("training state: refused the client at {}: {}", c.peer(), why);
    return;
  }
  while (true) {
    StateMessage m;
    try {
      m = c.receive();
    } catch (const StateTransferError&) {
      return;  // the client is done (one exchange per connection) or gone
    }
    if (m.kind == Kind::kPut) {
      put(c, m);
    } else if (m.kind == Kind::kGet) {
      get(c, m);
    } else {
      c.send(StateMessage{.kind = Kind::kError, .text = "expected put or get"});
      return;
    }
  }
}

void StateServer::put(StateConnection& c, const StateMessage& m) {
  const VersionName name{m.rank, m.step};
  if (m.bytes > replica_bytes_) {
    const std::string why = "a copy of " + mib_text(m.bytes) +
                            " is more than this node keeps for one rank (" + mib_text(replica_bytes_) +
                            ": half of its --state_memory share per local rank)";
    c.send(StateMessage{.kind = Kind::kError, .text = why});
    throw StateTransferError("refused rank " + std::to_string(m.rank) + "'s step " + std::to_string(m.step) +
                             " from " + c.peer() + ": " + why);
  }
  const auto tmp =
      dir_.replica() / ("." + version_file_name(name) + "." + std::to_string(++serial_) + ".tmp");
  if (std::string why =
          c.receive_version(m.rank, m.step, m.bytes, tmp, dir_.replica() / version_file_name(name));
      !why.empty()) {
    c.send(StateMessage{.kind = Kind::kError, .text = why});
    return;
  }
  // The two newest: a node's ranks are copied one after the other, and the node may be lost between; its
  // ranks restored from here must still have a step in common (the one before).
  StateDirectory::prune(dir_.replica(), m.rank, 2);
  ++copies_;
  bytes_ += m.bytes;
  c.send(StateMessage{.kind = Kind::kOk});
  spdlog::debug("training state: committed the copy of rank {}'s step {} ({}) from {}", m.rank, m.step,
                mib_text(m.bytes), c.peer());
}

void StateServer::get(StateConnection& c, const StateMessage& m) {
  std::vector<StoredVersion> found;
  for (const auto& sub : {dir_.replica(), dir_.own()}) {
    for (auto& v : StateDirectory::versions(sub)) {
      if (v.name.rank == m.rank && (m.step < 0 || v.name.step == m.step)) found.push_back(std::move(v));
    }
    if (!found.empty()) break;
  }
  for (const StoredVersion& v : found) {
    UniqueFd fd(::open(v.file.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) continue;  // pruned meanwhile
    c.send(StateMessage{.kind = Kind::kVersion,
                        .rank = m.rank,
                        .step = v.name.step,
                        .bytes = static_cast<uint64_t>(st.st_size)});
    c.send_file(fd.get(), static_cast<uint64_t>(st.st_size));
    ++served_;
  }
  c.send(StateMessage{.kind = Kind::kEnd});
}

}  // namespace ddprun::agent
