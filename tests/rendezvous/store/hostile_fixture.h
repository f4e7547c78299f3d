// Test helpers for the store's hostile-client integration tests: a raw POSIX socket (the bytes on the wire
// are exactly the test's), requests as bytes, and a server fixture with a few keys stored whose health the
// tests check after each hostile action. Header-only; every wait has a deadline.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "eventually.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv::hostile {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ddprun::testing::eventually;

// A blocking IPv4 loopback socket that never raises SIGPIPE.
class RawSocket {
 public:
  // `rcvbuf` > 0: the receive buffer's size. `mss` > 0: the largest segment the server may send (TCP_MAXSEG).
  // `source`: the local address to connect from (another loopback address, e.g. "127.0.0.2"); null: any.
  explicit RawSocket(uint16_t port, int rcvbuf = 0, int mss = 0, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    if (source) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      REQUIRE(::inet_pton(AF_INET, source, &local.sin_addr) == 1);
      REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0);
    }
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    if (mss > 0) ::setsockopt(fd_, IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof mss);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~RawSocket() { close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  // Sends everything; returns false when the server has already closed the connection.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads (and discards) until the server closes the connection; false if it is still open at `limit`.
  bool wait_closed(std::chrono::milliseconds limit = 10s) {
    auto deadline = Clock::now() + limit;
    char buf[64 * 1024];
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return false;
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return true;  // EOF or reset
    }
  }

  // Reads exactly `n` bytes; returns fewer when the connection ends or `limit` passes.
  std::string read(size_t n, std::chrono::milliseconds limit = 10s) {
    auto deadline = Clock::now() + limit;
    std::string out;
    char buf[64 * 1024];
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0ms || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      ssize_t got = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

inline std::string u64_bytes(uint64_t v) {
  std::string out;
  WireWriter(out).u64(v);
  return out;
}

inline std::string modern_hello() {
  std::string out;
  encode_request(Dialect::kModern, Request{.op = Op::kValidate, .number = kValidationMagic}, out);
  return out;
}

inline std::string encoded(Dialect d, const Request& req) {
  std::string out;
  REQUIRE(encode_request(d, req, out));
  return out;
}

inline StoreClientOptions client_options(Dialect d) {
  StoreClientOptions o;
  o.dialect = d;
  o.connect_timeout = 5s;
  o.timeout = 10s;
  return o;
}

// A server with small limits and a few keys stored by a well-behaved client.
struct Fixture {
  explicit Fixture(StoreServerOptions options = {}) : server(with_defaults(std::move(options))) {
    {
      StoreClient c("127.0.0.1", server.port(), client_options(Dialect::kModern));
      c.set("kept", "value");
      c.set("big", std::string(1 << 20, 'B'));
      REQUIRE(c.add("counter", 7) == 7);
    }
    REQUIRE(eventually([&] { return server.stats().connections == 0; }));  // the server saw it leave
  }

  static StoreServerOptions with_defaults(StoreServerOptions o) {
    o.host = "127.0.0.1";
    if (o.request_timeout == StoreServerOptions{}.request_timeout) o.request_timeout = 300ms;
    return o;
  }

  // Both dialects still get correct answers and the stored keys are intact.
  void require_healthy(int64_t keys = 3) {
    for (Dialect d : {Dialect::kModern, Dialect::kLegacy}) {
      CAPTURE(std::string(dialect_name(d)));
      StoreClient c("127.0.0.1", server.port(), client_options(d));
      REQUIRE(c.get("kept") == "value");
      REQUIRE(c.get("big") == std::string(1 << 20, 'B'));
      REQUIRE(c.add("counter", 0) == 7);
      c.set("fresh", dialect_name(d));
      REQUIRE(c.get("fresh") == dialect_name(d));
      REQUIRE(c.delete_key("fresh"));
    }
    REQUIRE(server.stats().keys == keys);
  }

  // The offender was dropped: `before` + 1, seen through the server's own counter.
  void require_dropped(uint64_t before) {
    REQUIRE(eventually([&] { return server.stats().dropped == before + 1; }));
  }

  StoreServerThread server;
};

// A modern client's WAIT on one key, as bytes.
inline std::string wait_request(const std::string& key) {
  return encoded(Dialect::kModern, Request{.op = Op::kWait, .keys = {key}});
}

// A fresh well-behaved client's round trip (ADD then GET) completes within `limit`.
inline bool round_trip_within(uint16_t port, std::chrono::milliseconds limit) {
  auto o = client_options(Dialect::kModern);
  o.timeout = limit;
  StoreClient c("127.0.0.1", port, o);
  c.add("probe", 1);
  return c.get("kept") == "value";
}

constexpr size_t kMiB = size_t{1} << 20;

// A client that reads slowly, or not at all: a 4 KiB receive buffer, so that what the store owes it stays
// queued in the store, and Ethernet's segment size (1448 bytes): loopback's 64 KiB segments would make the
// kernel give the store's side of each connection a send buffer of ~2.5 MiB (1000 such clients: 2.5 GB of
// kernel memory, past tcp_mem's pressure mark). Such a client stays slow: its window stays at a few KiB
// however much it reads later, and a read of megabytes through it was seen to stall for 30 s.
inline std::unique_ptr<RawSocket> slow_reader(uint16_t port) {
  return std::make_unique<RawSocket>(port, 4096, 1448);
}

// The i-th of n attacking clients: a slow_reader, except the first and the last, which have ordinary
// buffers (and read nothing either until the test reads, at the end, everything the store owed them).
inline std::unique_ptr<RawSocket> attacker(uint16_t port, size_t i, size_t n) {
  return i == 0 || i + 1 == n ? std::make_unique<RawSocket>(port) : slow_reader(port);
}

// `n` connections (attacker()s, or with `all_slow` slow_reader()s) that watch `key` on the legacy callback
// protocol and never read past the acknowledgement: what the store sends them stays queued in the store.
inline std::vector<std::unique_ptr<RawSocket>> silent_watchers(uint16_t port, size_t n,
                                                               const std::string& key,
                                                               bool all_slow = false) {
  std::vector<std::unique_ptr<RawSocket>> watchers;
  for (size_t i = 0; i < n; ++i) {
    watchers.push_back(all_slow ? slow_reader(port) : attacker(port, i, n));
    REQUIRE(watchers.back()->send(encoded(Dialect::kLegacy, Request{.op = Op::kWatchKey, .keys = {key}})));
    REQUIRE(watchers.back()->read(1) == std::string(1, static_cast<char>(WatchEvent::kCallbackRegistered)));
  }
  return watchers;
}

// The reply to a legacy GET, or a WATCH_KEY notification, as the client must read it.
inline std::string string_field(const std::string& v) {
  std::string out;
  WireWriter(out).bytes(v);
  return out;
}

inline std::string notification(WatchEvent event, const std::string& key, const std::string& old_value,
                                const std::string& new_value) {
  return std::string(1, static_cast<char>(event)) + string_field(key) + string_field(old_value) +
         string_field(new_value);
}

}  // namespace ddprun::rdzv::hostile
