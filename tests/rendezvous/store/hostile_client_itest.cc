// Integration tests: clients that misbehave on a raw socket. After each hostile action the server must
// have dropped (or refused) the offender, keep serving well-behaved clients correctly, and keep every
// stored key. Clients that do not read what the store owes them: hostile_reader_itest.cc.
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/wire_codec.h"
#include "tests/rendezvous/store/hostile_fixture.h"

namespace ddprun::rdzv {

using namespace ddprun::rdzv::hostile;

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

TEST_CASE(
    "Hostile client: a hundred thousand WAITs on one key complete and vanish without freezing the store",
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

}  // namespace ddprun::rdzv
