// Integration tests: clients that misbehave on a raw socket. After each hostile action the server must
// have dropped (or refused) the offender, keep serving well-behaved clients correctly, and keep every
// stored key. Raw sockets are plain POSIX sockets so the bytes on the wire are exactly the test's.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.h"
#include "eventually.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_error.h"
#include "rendezvous/store_server.h"
#include "rendezvous/wire_codec.h"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A blocking IPv4 loopback socket that never raises SIGPIPE.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
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
    char buf[4096];
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

using ddprun::testing::eventually;

std::string u64_bytes(uint64_t v) {
  std::string out;
  WireWriter(out).u64(v);
  return out;
}

std::string modern_hello() {
  std::string out;
  encode_request(Dialect::kModern, Request{.op = Op::kValidate, .number = kValidationMagic}, out);
  return out;
}

std::string encoded(Dialect d, const Request& req) {
  std::string out;
  REQUIRE(encode_request(d, req, out));
  return out;
}

StoreClientOptions client_options(Dialect d) {
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

}  // namespace

TEST_CASE("Hostile client: truncated frame then close", "[store][hostile][integration]") {
  Fixture f;
  {
    RawSocket s(f.server.port());
    REQUIRE(s.send(std::string(1, '\0') + u64_bytes(10) + "abc"));  // SET, key of 10 bytes, 3 sent
  }
  // The peer left mid-request: a normal end for the server (not "dropped"), but nothing may be kept.
  REQUIRE(eventually([&] { return f.server.stats().connections == 0; }));
  REQUIRE(f.server.stats().dropped == 0);
  f.require_healthy();
}

TEST_CASE("Hostile client: absurd lengths are refused before buffering", "[store][hostile][integration]") {
  Dialect dialect = GENERATE(Dialect::kModern, Dialect::kLegacy);
  // 0 stands for "one past the limit" of the field being tested.
  uint64_t length = GENERATE(uint64_t{0}, uint64_t{1} << 63, ~uint64_t{0});
  CAPTURE(std::string(dialect_name(dialect)), length);
  // A long request timeout: the connection must end because of the length, not because it stalls.
  StoreServerOptions options;
  options.request_timeout = 60s;
  Fixture f(options);
  const WireLimits limits;
  auto or_over = [&](size_t limit) { return length == 0 ? uint64_t{limit} + 1 : length; };
  std::string prefix = dialect == Dialect::kModern ? modern_hello() : "";
  std::string set_byte(1, static_cast<char>(*op_to_byte(dialect, Op::kSet)));

  SECTION("key length") {
    RawSocket s(f.server.port());
    s.send(prefix + set_byte + u64_bytes(or_over(limits.max_key_bytes)) + "key");
    REQUIRE(s.wait_closed());
  }
  SECTION("value length") {
    RawSocket s(f.server.port());
    s.send(prefix + set_byte + u64_bytes(1) + "k" + u64_bytes(or_over(limits.max_value_bytes)) + "v");
    REQUIRE(s.wait_closed());
  }
  SECTION("key count of CHECK") {
    RawSocket s(f.server.port());
    std::string check_byte(1, static_cast<char>(*op_to_byte(dialect, Op::kCheck)));
    s.send(prefix + check_byte + u64_bytes(or_over(limits.max_keys_per_request)) + u64_bytes(1) + "k");
    REQUIRE(s.wait_closed());
  }
  f.require_dropped(0);
  f.require_healthy();
}

TEST_CASE("Hostile client: random bytes", "[store][hostile][integration]") {
  uint32_t seed = GENERATE(range(1u, 9u));
  bool after_hello = seed % 2 == 0;
  CAPTURE(seed, after_hello);
  Fixture f;
  std::mt19937 rng(seed);
  std::string junk(4096, '\0');
  for (auto& c : junk) c = static_cast<char>(rng() & 0xFF);
  {
    RawSocket s(f.server.port());
    s.send((after_hello ? modern_hello() : "") + junk);
    // Dropped on a parse error, or by the request timeout when the junk declares a plausible length.
    REQUIRE(s.wait_closed());
  }
  f.require_dropped(0);
  f.require_healthy();
}

TEST_CASE("Hostile client: unknown command byte", "[store][hostile][integration]") {
  StoreServerOptions options;
  options.request_timeout = 60s;  // dropped for the byte, not for stalling
  Fixture f(options);
  SECTION("legacy") {
    uint8_t byte = GENERATE(uint8_t{0x0C}, uint8_t{0x42}, uint8_t{0xFF});
    CAPTURE(int(byte));
    RawSocket s(f.server.port());
    s.send(std::string(1, static_cast<char>(byte)) + u64_bytes(1) + "k");
    REQUIRE(s.wait_closed());
  }
  SECTION("modern, after a valid request") {
    uint8_t byte = GENERATE(uint8_t{18}, uint8_t{0x80}, uint8_t{0xFF});
    CAPTURE(int(byte));
    RawSocket s(f.server.port());
    s.send(modern_hello() + encoded(Dialect::kModern, Request{.op = Op::kGetNumKeys}) +
           std::string(1, static_cast<char>(byte)));
    REQUIRE(s.wait_closed());
  }
  SECTION("VALIDATE again with a wrong magic") {
    RawSocket s(f.server.port());
    s.send(modern_hello() + encoded(Dialect::kModern, Request{.op = Op::kValidate, .number = 1234}));
    REQUIRE(s.wait_closed());
  }
  f.require_dropped(0);
  f.require_healthy();
}

TEST_CASE("Hostile client: a request that never completes is dropped", "[store][hostile][integration]") {
  Fixture f;  // request_timeout 300 ms
  SECTION("stalled") {
    RawSocket s(f.server.port());
    s.send(std::string("\x02", 1) + u64_bytes(5) + "ab");  // legacy GET of a 5-byte key, 2 sent
    REQUIRE(s.wait_closed());
  }
  SECTION("trickling one byte at a time") {
    RawSocket s(f.server.port());
    std::string request = std::string("\x02", 1) + u64_bytes(60000) + std::string(60000, 'k');
    bool closed = false;
    auto deadline = Clock::now() + 10s;
    for (size_t i = 0; i < request.size() && !closed && Clock::now() < deadline; ++i) {
      if (!s.send(request.substr(i, 1))) break;
      closed = s.wait_closed(20ms);  // progress does not extend the deadline of the request
    }
    REQUIRE((closed || s.wait_closed()));
  }
  f.require_dropped(0);
  f.require_healthy();
}

TEST_CASE("Hostile client: connections beyond max_connections are refused", "[store][hostile][integration]") {
  StoreServerOptions options;
  options.max_connections = 8;
  Fixture f(options);
  std::vector<std::unique_ptr<RawSocket>> held;
  for (int i = 0; i < 8; ++i) held.push_back(std::make_unique<RawSocket>(f.server.port()));
  REQUIRE(eventually([&] { return f.server.stats().connections == 8; }));
  for (int i = 0; i < 4; ++i) {
    RawSocket extra(f.server.port());  // the kernel accepts; the server closes it at once
    REQUIRE(extra.wait_closed());
  }
  REQUIRE(f.server.stats().refused == 4);
  REQUIRE(f.server.stats().connections == 8);
  // Those inside the limit are still served.
  REQUIRE(held[0]->send(encoded(Dialect::kLegacy, Request{.op = Op::kGetNumKeys})));
  REQUIRE(held[0]->read(8) == u64_bytes(3));
  held.clear();
  REQUIRE(eventually([&] { return f.server.stats().connections == 0; }));
  REQUIRE(f.server.stats().dropped == 0);
  f.require_healthy();
}

TEST_CASE("Hostile client: pipelined GETs of a large value without reading",
          "[store][hostile][integration]") {
  StoreServerOptions options;
  options.max_output_bytes = 2 << 20;
  Fixture f(options);
  std::string get_big = encoded(Dialect::kLegacy, Request{.op = Op::kGet, .keys = {"/big"}});
  uint64_t requests = f.server.stats().requests;

  SECTION("in one burst") {
    // 2000 GETs in one 26 KB write would ask for 2 GB of replies: the server must stop at its limit.
    RawSocket s(f.server.port(), 4096);
    std::string burst;
    for (int i = 0; i < 2000; ++i) burst += get_big;
    s.send(burst);
    f.require_dropped(0);
    REQUIRE(s.wait_closed());
    REQUIRE(f.server.stats().requests - requests < 100);
  }
  SECTION("one request at a time") {
    RawSocket s(f.server.port(), 4096);
    for (int i = 0; i < 200 && f.server.stats().dropped == 0; ++i) {
      if (!s.send(get_big)) break;
    }
    f.require_dropped(0);
    REQUIRE(s.wait_closed());
  }
  f.require_healthy();
}

TEST_CASE("Hostile client: a repeated WATCH_KEY of one key is registered once",
          "[store][hostile][integration]") {
  // Otherwise every write of the key would be notified once per registration: 100 kB of WATCH_KEY and one
  // SET of a 64 MB value would make terabytes of replies.
  Fixture f;
  constexpr int kWatches = 1000;
  const std::string value(64 * 1024, 'w');
  std::string burst;
  for (int i = 0; i < kWatches; ++i)
    burst += encoded(Dialect::kLegacy, Request{.op = Op::kWatchKey, .keys = {"/w"}});
  burst += encoded(Dialect::kLegacy, Request{.op = Op::kSet, .keys = {"/w"}, .values = {value}});
  burst += encoded(Dialect::kLegacy, Request{.op = Op::kGetNumKeys});
  std::string expected(kWatches, static_cast<char>(WatchEvent::kCallbackRegistered));
  WireWriter w(expected);
  w.u8(static_cast<uint8_t>(WatchEvent::kKeyCreated));
  w.bytes("/w");
  w.bytes("");
  w.bytes(value);
  w.i64(4);  // GETNUMKEYS right after the one notification

  RawSocket s(f.server.port());
  REQUIRE(s.send(burst));
  std::string got = s.read(expected.size());
  REQUIRE(got.size() == expected.size());
  REQUIRE(got == expected);
  REQUIRE(f.server.stats().dropped == 0);
  f.require_healthy(4);
}

TEST_CASE("Hostile client: a watcher that never reads its notifications is dropped",
          "[store][hostile][integration]") {
  // Every SET of a watched key queues a notification carrying the old and the new value on the watcher's
  // connection. One that never reads must be dropped at the output limit, not hold every write in memory.
  StoreServerOptions options;
  options.max_output_bytes = 2 << 20;
  Fixture f(options);
  RawSocket watcher(f.server.port(), 4096);
  REQUIRE(watcher.send(encoded(Dialect::kLegacy, Request{.op = Op::kWatchKey, .keys = {"/w"}})));
  REQUIRE(watcher.read(1) == std::string(1, static_cast<char>(WatchEvent::kCallbackRegistered)));

  StoreClient setter("127.0.0.1", f.server.port(), client_options(Dialect::kLegacy));
  const std::string value(256 * 1024, 'v');
  int sets = 0;
  for (; sets < 200 && f.server.stats().dropped == 0; ++sets) setter.set("w", value);
  f.require_dropped(0);
  CAPTURE(sets);
  CHECK(sets < 200);  // dropped after about (2 MiB + socket buffers) / 512 KiB of notifications
  REQUIRE(watcher.wait_closed());
  setter.set("w", "small");  // the writer is still served
  REQUIRE(setter.get("w") == "small");
  REQUIRE(setter.delete_key("w"));
  f.require_healthy();
}


namespace {

// A modern client's WAIT on one key, as bytes.
std::string wait_request(const std::string& key) {
  return encoded(Dialect::kModern, Request{.op = Op::kWait, .keys = {key}});
}

// A fresh well-behaved client's round trip (ADD then GET) completes within `limit`.
bool round_trip_within(uint16_t port, std::chrono::milliseconds limit) {
  auto o = client_options(Dialect::kModern);
  o.timeout = limit;
  StoreClient c("127.0.0.1", port, o);
  c.add("probe", 1);
  return c.get("kept") == "value";
}

}  // namespace

TEST_CASE("Hostile client: more WAITs pending than the per-connection limit is dropped",
          "[store][hostile][integration]") {
  StoreServerOptions options;
  options.limits.max_pending_waits = 100;
  Fixture f(options);
  const auto before = f.server.stats().dropped;
  RawSocket s(f.server.port());
  std::string burst = modern_hello();
  for (int i = 0; i < 101; ++i) burst += wait_request("never");
  REQUIRE(s.send(burst));
  REQUIRE(s.wait_closed());
  f.require_dropped(before);
  REQUIRE(eventually([&] { return f.server.stats().pending_waits == 0; }));  // its waits went with it
  f.require_healthy();
}

TEST_CASE("Hostile client: a hundred thousand WAITs on one key complete and vanish without freezing the store",
          "[store][hostile][integration]") {
  Fixture f;
  const int connections = 100, waits = 1000;  // each connection at the default limit (1024)
  std::vector<std::unique_ptr<RawSocket>> clients;
  std::string burst;
  for (int i = 0; i < waits; ++i) burst += wait_request("/hot");  // StoreClient puts "/" before its keys
  for (int c = 0; c < connections; ++c) {
    clients.push_back(std::make_unique<RawSocket>(f.server.port()));
    REQUIRE(clients.back()->send(modern_hello() + burst));
  }
  REQUIRE(eventually([&] { return f.server.stats().pending_waits == connections * waits; }, 60s));
  REQUIRE(round_trip_within(f.server.port(), 5s));
  // Half of the clients leave: their waits are cancelled; then the key is set: the rest complete at once.
  for (int c = 0; c < connections / 2; ++c) clients[static_cast<size_t>(c)]->close();
  REQUIRE(eventually([&] { return f.server.stats().pending_waits == connections / 2 * waits; }, 60s));
  {
    StoreClient writer("127.0.0.1", f.server.port(), client_options(Dialect::kModern));
    writer.set("hot", "x");
  }
  for (int c = connections / 2; c < connections; ++c) {
    REQUIRE(clients[static_cast<size_t>(c)]->read(static_cast<size_t>(waits), 30s) ==
            std::string(static_cast<size_t>(waits), '\0'));  // one "stop waiting" per WAIT
  }
  REQUIRE(f.server.stats().pending_waits == 0);
  REQUIRE(round_trip_within(f.server.port(), 5s));
  clients.clear();
  f.require_healthy(5);  // "hot" and "probe" added
}

TEST_CASE("Hostile client: silent connections are reclaimed, oldest first, only near the connection limit",
          "[store][hostile][integration]") {
  StoreServerOptions options;
  options.max_connections = 10;
  options.silent_timeout = 200ms;
  Fixture f(options);
  std::vector<std::unique_ptr<RawSocket>> silent;
  for (int i = 0; i < 5; ++i) silent.push_back(std::make_unique<RawSocket>(f.server.port()));
  REQUIRE(eventually([&] { return f.server.stats().connections == 5; }));
  std::this_thread::sleep_for(400ms);  // older than silent_timeout, but the server is far from its limit
  REQUIRE(round_trip_within(f.server.port(), 5s));
  REQUIRE(f.server.stats().dropped == 0);  // like torch 1.13's idle callback connections: kept
  // Near the limit (9 of 10), the old silent ones make room, oldest first; the young ones stay.
  for (int i = 0; i < 5; ++i) silent.push_back(std::make_unique<RawSocket>(f.server.port()));
  REQUIRE(silent[0]->wait_closed(5s));
  REQUIRE(eventually([&] { return f.server.stats().dropped >= 1 && f.server.stats().connections <= 9; }));
  std::this_thread::sleep_for(400ms);
  for (int i = 0; i < 4; ++i) REQUIRE(round_trip_within(f.server.port(), 5s));
  REQUIRE(f.server.stats().refused == 0);
  silent.clear();
  f.require_healthy(4);  // "probe" added
}

TEST_CASE("Hostile client: watchers that never read cannot take the store past its memory budget",
          "[store][hostile][integration]") {
  // 40 watchers of one key, none reading; 5 SETs of 2 MiB would queue 40 x 5 x 4 MiB (old and new value) =
  // 800 MiB of notifications. Each watcher stays under its own output limit; the budget for all is 64 MiB.
  StoreServerOptions options;
  options.memory_budget = 64 << 20;
  Fixture f(options);
  const int watchers = 40;
  std::vector<std::unique_ptr<RawSocket>> held;
  for (int i = 0; i < watchers; ++i) {
    held.push_back(std::make_unique<RawSocket>(f.server.port(), 4096));
    REQUIRE(held.back()->send(encoded(Dialect::kLegacy, Request{.op = Op::kWatchKey, .keys = {"/w"}})));
    REQUIRE(held.back()->read(1) == std::string(1, static_cast<char>(WatchEvent::kCallbackRegistered)));
  }
  StoreClient setter("127.0.0.1", f.server.port(), client_options(Dialect::kLegacy));
  const std::string value(2 << 20, 'v');
  for (int i = 0; i < 5; ++i) {
    setter.set("w", value);
    REQUIRE(round_trip_within(f.server.port(), 5s));
  }
  const auto stats = f.server.stats();
  CAPTURE(stats.peak_buffered_bytes, stats.dropped);
  // At most the budget plus the notifications of the one SET that crossed it (40 x 4 MiB).
  CHECK(stats.peak_buffered_bytes <= options.memory_budget + watchers * (4u << 20));
  CHECK(stats.dropped > 0);
  REQUIRE(eventually([&] { return f.server.stats().buffered_bytes <= options.memory_budget; }));
  REQUIRE(setter.get("w") == value);  // stored data is never dropped
  REQUIRE(setter.delete_key("w"));
  held.clear();
  f.require_healthy(4);
}

TEST_CASE("Hostile client: unfinished requests count against the memory budget",
          "[store][hostile][integration]") {
  // 16 clients each send 15 of the 16 MiB of a SET they declared, then stall: 240 MiB held without a budget.
  StoreServerOptions options;
  options.memory_budget = 64 << 20;
  options.request_timeout = 60s;  // the budget must act, not the timeout
  Fixture f(options);
  std::vector<std::unique_ptr<RawSocket>> stalled;
  const std::string chunk(1 << 20, 'x');
  for (int c = 0; c < 16; ++c) {
    stalled.push_back(std::make_unique<RawSocket>(f.server.port()));
    std::string head = std::string(1, '\0') + u64_bytes(1) + "k" + u64_bytes(16 << 20);  // legacy SET
    if (!stalled.back()->send(head)) continue;
    for (int mb = 0; mb < 15; ++mb) {
      if (!stalled.back()->send(chunk)) break;  // dropped meanwhile
    }
  }
  REQUIRE(eventually([&] { return f.server.stats().dropped > 0; }));
  REQUIRE(eventually([&] { return f.server.stats().buffered_bytes <= options.memory_budget; }));
  REQUIRE(round_trip_within(f.server.port(), 5s));
  stalled.clear();
  f.require_healthy(4);
}

}  // namespace ddprun::rdzv
