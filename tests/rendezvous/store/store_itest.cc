// Integration tests: StoreServerThread and StoreClient over real loopback sockets, in the modern and the
// legacy dialect. Every server binds port 0; synchronisation uses server stats and futures, never fixed
// sleeps; every wait is bounded.
#include <atomic>
#include <chrono>
#include <future>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.h"
#include "eventually.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_probe.h"
#include "rendezvous/store/store_server.h"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

StoreServerOptions loopback_server() {
  StoreServerOptions o;
  o.host = "127.0.0.1";
  return o;
}

StoreClientOptions client_options(Dialect d, std::chrono::milliseconds timeout = 10s) {
  StoreClientOptions o;
  o.dialect = d;
  o.connect_timeout = 5s;
  o.timeout = timeout;
  return o;
}

using ddprun::testing::eventually;

std::string endpoint_text(uint16_t port) {
  return "127.0.0.1:" + std::to_string(port);
}

}  // namespace

TEST_CASE("StoreClient performs every Store operation against StoreServer", "[store][integration]") {
  Dialect dialect = GENERATE(Dialect::kModern, Dialect::kLegacy);
  CAPTURE(std::string(dialect_name(dialect)));
  StoreServerThread server(loopback_server());
  StoreClient c("127.0.0.1", server.port(), client_options(dialect));
  REQUIRE(c.dialect() == dialect);
  REQUIRE(c.endpoint() == endpoint_text(server.port()));

  c.set("a", "1");
  REQUIRE(c.get("a") == "1");
  const std::string binary("x\0y\xff", 4);
  c.set("bin", binary);
  REQUIRE(c.get("bin") == binary);
  c.set("empty", "");
  REQUIRE(c.get("empty").empty());
  const std::string big(1 << 20, 'b');
  c.set("big", big);
  REQUIRE(c.get("big") == big);
  c.set("a", "2");  // overwrite
  REQUIRE(c.get("a") == "2");

  REQUIRE(c.add("n", 5) == 5);  // missing counts as 0
  REQUIRE(c.add("n", -2) == 3);
  REQUIRE(c.add("n", 0) == 3);
  REQUIRE(c.get("n") == "3");

  REQUIRE(c.compare_set("cs", "", "v1") == "v1");  // missing + empty expected: stored
  REQUIRE(c.compare_set("cs", "wrong", "v2") == "v1");
  REQUIRE(c.compare_set("cs", "v1", "v2") == "v2");
  REQUIRE(c.compare_set("nokey", "exp", "d") == "exp");  // missing + non-empty expected: unchanged
  REQUIRE_FALSE(c.check({"nokey"}));

  REQUIRE(c.check({"a", "n", "cs"}));
  REQUIRE_FALSE(c.check({"a", "absent"}));
  c.wait({"a", "n"}, 5s);  // present: returns at once

  REQUIRE(c.num_keys() == 6);  // a bin empty big n cs
  REQUIRE(server.stats().keys == 6);
  REQUIRE(c.delete_key("a"));
  REQUIRE_FALSE(c.delete_key("a"));
  REQUIRE_FALSE(c.check({"a"}));
  REQUIRE(c.num_keys() == 5);

  if (dialect == Dialect::kModern) {
    c.append("ap", "x");
    c.append("ap", "yz");
    REQUIRE(c.get("ap") == "xyz");
    c.multi_set({"m1", "m2"}, {"v1", "v2"});
    REQUIRE(c.multi_get({"m2", "m1", "big"}) == std::vector<std::string>{"v2", "v1", big});
  } else {
    // The legacy protocol has no APPEND/MULTI_*; refused before anything is sent.
    REQUIRE_THROWS_AS(c.append("ap", "x"), InvalidArgumentError);
    REQUIRE_THROWS_AS(c.multi_set({"m1"}, {"v1"}), InvalidArgumentError);
    REQUIRE_THROWS_AS(c.multi_get({"bin"}), InvalidArgumentError);
  }
  REQUIRE_THROWS_AS(c.multi_set({"m1", "m2"}, {"v1"}), InvalidArgumentError);
  REQUIRE_THROWS_AS(c.set(std::string(64 * 1024 + 1, 'k'), "v"), InvalidArgumentError);
  REQUIRE(c.get("bin") == binary);  // still in step after the refusals

  SECTION("ADD on a value that is not an integer fails and the client recovers") {
    c.set("text", "abc");
    REQUIRE_THROWS_AS(c.add("text", 1), StoreError);
    REQUIRE(c.get("text") == "abc");
    REQUIRE(c.add("n", 1) == 4);
  }
}

TEST_CASE("get() blocks until another client sets the key", "[store][integration]") {
  Dialect dialect = GENERATE(Dialect::kModern, Dialect::kLegacy);
  CAPTURE(std::string(dialect_name(dialect)));
  StoreServerThread server(loopback_server());
  StoreClient waiter("127.0.0.1", server.port(), client_options(dialect));
  StoreClient setter("127.0.0.1", server.port(), client_options(dialect));

  SECTION("get") {
    auto got = std::async(std::launch::async, [&] { return waiter.get("late"); });
    REQUIRE(eventually([&] { return server.stats().pending_waits == 1; }));
    REQUIRE(got.wait_for(0s) == std::future_status::timeout);
    setter.set("late", "value");
    REQUIRE(got.wait_for(10s) == std::future_status::ready);
    REQUIRE(got.get() == "value");
  }
  SECTION("wait on two keys needs both") {
    auto waited = std::async(std::launch::async, [&] { waiter.wait({"k1", "k2"}, 10s); });
    REQUIRE(eventually([&] { return server.stats().pending_waits == 1; }));
    setter.set("k1", "x");
    REQUIRE(setter.check({"k1"}));  // the server has handled the SET
    REQUIRE(server.stats().pending_waits == 1);
    setter.set("k2", "y");
    REQUIRE(waited.wait_for(10s) == std::future_status::ready);
    REQUIRE_NOTHROW(waited.get());
  }
  if (dialect == Dialect::kModern) {
    SECTION("multi_get") {
      auto got = std::async(std::launch::async, [&] { return waiter.multi_get({"m1", "m2"}); });
      REQUIRE(eventually([&] { return server.stats().pending_waits == 1; }));
      setter.multi_set({"m1", "m2"}, {"1", "2"});
      REQUIRE(got.wait_for(10s) == std::future_status::ready);
      REQUIRE(got.get() == std::vector<std::string>{"1", "2"});
    }
  }
  REQUIRE(server.stats().pending_waits == 0);
}

TEST_CASE("A wait that times out throws TimeoutError and leaves the client usable", "[store][integration]") {
  Dialect dialect = GENERATE(Dialect::kModern, Dialect::kLegacy);
  CAPTURE(std::string(dialect_name(dialect)));
  StoreServerThread server(loopback_server());
  StoreClient c("127.0.0.1", server.port(), client_options(dialect));
  c.set("present", "p");
  REQUIRE(c.get("present") == "p");  // a round trip: the server has accepted this connection
  uint64_t accepted = server.stats().accepted;

  auto start = Clock::now();
  try {
    c.wait({"never"}, 300ms);
    FAIL("wait() returned for a key nobody set");
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    CAPTURE(what);
    REQUIRE(what.find(endpoint_text(server.port())) != std::string::npos);
    REQUIRE(what.find("never") != std::string::npos);
  }
  REQUIRE(Clock::now() - start < 5s);  // bounded by the timeout plus the cancel round trip

  // No stray WAIT reply may arrive later and desynchronise the stream.
  c.set("never", "now");
  REQUIRE(c.get("never") == "now");
  REQUIRE(c.get("present") == "p");
  if (dialect == Dialect::kModern) {
    REQUIRE(server.stats().accepted == accepted);  // CANCEL_WAIT kept the connection
    REQUIRE(server.stats().pending_waits == 0);
  } else {
    REQUIRE(server.stats().accepted == accepted + 1);  // reconnected
    REQUIRE(eventually([&] { return server.stats().pending_waits == 0; }));
  }

  c.set_timeout(300ms);
  REQUIRE_THROWS_AS(c.get("missing"), TimeoutError);
  c.set_timeout(10s);
  REQUIRE(c.get("present") == "p");
}

TEST_CASE("PrefixStore keys are <prefix>/<key> on the wire, as in torch", "[store][integration]") {
  StoreServerThread server(loopback_server());
  auto base = std::make_shared<StoreClient>("127.0.0.1", server.port(), client_options(Dialect::kModern));
  PrefixStore ps("job", base);
  StoreClient plain("127.0.0.1", server.port(), client_options(Dialect::kModern));
  auto raw_options = client_options(Dialect::kLegacy);
  raw_options.key_prefix = "";
  StoreClient raw("127.0.0.1", server.port(), raw_options);

  ps.set("a", "1");
  REQUIRE(plain.get("job/a") == "1");
  REQUIRE(raw.get("/job/a") == "1");  // torch's client adds "/" in front of every key
  REQUIRE(ps.get("a") == "1");
  REQUIRE(ps.add("n", 2) == 2);
  REQUIRE(plain.get("job/n") == "2");
  REQUIRE(ps.compare_set("cs", "", "x") == "x");
  REQUIRE(ps.check({"a", "n", "cs"}));
  REQUIRE_FALSE(plain.check({"a"}));
  ps.wait({"a"}, 5s);
  ps.append("a", "2");
  REQUIRE(plain.get("job/a") == "12");
  ps.multi_set({"m"}, {"v"});
  REQUIRE(plain.multi_get({"job/m"}) == std::vector<std::string>{"v"});
  REQUIRE(ps.multi_get({"m", "a"}) == std::vector<std::string>{"v", "12"});
  REQUIRE(ps.num_keys() == plain.num_keys());  // the whole store, as in torch
  REQUIRE(ps.delete_key("m"));
  REQUIRE_FALSE(plain.check({"job/m"}));

  PrefixStore nested("outer", std::make_shared<PrefixStore>("inner", base));
  nested.set("k", "v");
  REQUIRE(plain.get("inner/outer/k") == "v");

  auto waited = std::async(std::launch::async, [&] { return ps.get("later"); });
  REQUIRE(eventually([&] { return server.stats().pending_waits == 1; }));
  plain.set("job/later", "ok");
  REQUIRE(waited.wait_for(10s) == std::future_status::ready);
  REQUIRE(waited.get() == "ok");
}

TEST_CASE("Many threads can share one StoreClient", "[store][integration]") {
  Dialect dialect = GENERATE(Dialect::kModern, Dialect::kLegacy);
  CAPTURE(std::string(dialect_name(dialect)));
  StoreServerThread server(loopback_server());
  StoreClient c("127.0.0.1", server.port(), client_options(dialect));
  constexpr int kThreads = 8;
  constexpr int kRounds = 100;
  std::atomic<int> mismatches{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kRounds; ++i) {
          std::string key = "t" + std::to_string(t);
          std::string value = key + "-" + std::to_string(i);
          c.set(key, value);
          if (c.get(key) != value) ++mismatches;
          c.add("counter", 1);
        }
      });
    }
  }
  REQUIRE(mismatches == 0);
  REQUIRE(c.add("counter", 0) == kThreads * kRounds);
  REQUIRE(server.stats().accepted == 1);
}

TEST_CASE("200 clients adding concurrently to one counter get an exact total", "[store][integration]") {
  StoreServerThread server(loopback_server());
  constexpr int kClients = 200;
  constexpr int kAdds = 10;
  std::latch connected(kClients);
  std::atomic<int> failures{0};
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back([&, i] {
        std::optional<StoreClient> c;
        try {
          c.emplace("127.0.0.1", server.port(),
                    client_options(i % 2 ? Dialect::kLegacy : Dialect::kModern, 60s));
        } catch (const StoreError&) {
          ++failures;
        }
        connected.arrive_and_wait();  // everyone connected: the adds overlap
        if (!c) return;
        try {
          for (int k = 0; k < kAdds; ++k) c->add("counter", 1);
        } catch (const StoreError&) {
          ++failures;
        }
      });
    }
  }
  REQUIRE(failures == 0);
  StoreClient check("127.0.0.1", server.port(), client_options(Dialect::kModern));
  REQUIRE(check.add("counter", 0) == kClients * kAdds);
  REQUIRE(server.stats().accepted == kClients + 1);
  REQUIRE(server.stats().dropped == 0);
}

TEST_CASE("The store works over IPv6 loopback", "[store][integration]") {
  std::unique_ptr<StoreServerThread> server;
  StoreServerOptions options;
  options.host = "::1";
  try {
    server = std::make_unique<StoreServerThread>(options);
  } catch (const BindError& e) {
    WARN("skipped: this host has no IPv6 loopback (" << e.what() << ")");
    return;
  }
  REQUIRE(server->local_endpoint() == "[::1]:" + std::to_string(server->port()));
  StoreClient c("::1", server->port(), client_options(Dialect::kModern));
  REQUIRE(c.endpoint() == "[::1]:" + std::to_string(server->port()));
  c.set("v6", "yes");
  REQUIRE(c.get("v6") == "yes");

  // The default address (every interface, dual-stack) serves both families.
  StoreServerThread any(StoreServerOptions{});
  StoreClient v4("127.0.0.1", any.port(), client_options(Dialect::kLegacy));
  StoreClient v6("::1", any.port(), client_options(Dialect::kModern));
  v4.set("k", "from v4");
  REQUIRE(v6.get("k") == "from v4");
}

TEST_CASE("Binding a port in use throws BindError naming addr:port", "[store][integration]") {
  StoreServerThread first(loopback_server());
  StoreServerOptions options = loopback_server();
  options.port = first.port();
  try {
    StoreServerThread second(options);
    FAIL("a second server bound " << endpoint_text(first.port()));
  } catch (const BindError& e) {
    std::string what = e.what();
    CAPTURE(what);
    REQUIRE(what.find(endpoint_text(first.port())) != std::string::npos);
    REQUIRE(what.find("in use") != std::string::npos);
  }
  // The first server is unharmed.
  StoreClient c("127.0.0.1", first.port(), client_options(Dialect::kModern));
  c.set("k", "v");
  REQUIRE(c.get("k") == "v");
}

TEST_CASE("Connecting to a closed port throws TimeoutError within connect_timeout", "[store][integration]") {
  uint16_t port = 0;
  {
    StoreServerThread gone(loopback_server());
    port = gone.port();
  }
  auto options = client_options(GENERATE(Dialect::kModern, Dialect::kLegacy));
  options.connect_timeout = 500ms;
  auto start = Clock::now();
  try {
    StoreClient c("127.0.0.1", port, options);
    FAIL("connected to a closed port");
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    CAPTURE(what);
    REQUIRE(what.find(endpoint_text(port)) != std::string::npos);
  }
  REQUIRE(Clock::now() - start < 5s);
}

TEST_CASE("Every call after close() throws ClosedError", "[store][integration]") {
  Dialect dialect = GENERATE(Dialect::kModern, Dialect::kLegacy);
  StoreServerThread server(loopback_server());
  StoreClient c("127.0.0.1", server.port(), client_options(dialect));
  c.set("k", "v");
  c.close();
  c.close();  // idempotent
  REQUIRE_THROWS_AS(c.set("k", "v"), ClosedError);
  REQUIRE_THROWS_AS(c.get("k"), ClosedError);
  REQUIRE_THROWS_AS(c.add("k", 1), ClosedError);
  REQUIRE_THROWS_AS(c.compare_set("k", "v", "w"), ClosedError);
  REQUIRE_THROWS_AS(c.check({"k"}), ClosedError);
  REQUIRE_THROWS_AS(c.wait({"k"}, 1s), ClosedError);
  REQUIRE_THROWS_AS(c.delete_key("k"), ClosedError);
  REQUIRE_THROWS_AS(c.num_keys(), ClosedError);
  REQUIRE(eventually([&] { return server.stats().connections == 0; }));
}

TEST_CASE("Stopping the server fails a blocked client instead of hanging it", "[store][integration]") {
  Dialect dialect = GENERATE(Dialect::kModern, Dialect::kLegacy);
  CAPTURE(std::string(dialect_name(dialect)));
  StoreServerThread server(loopback_server());
  auto options = client_options(dialect, 60s);
  options.connect_timeout = 1s;  // for the reconnect attempt at the end
  StoreClient c("127.0.0.1", server.port(), options);
  auto blocked = std::async(std::launch::async, [&] { return c.get("never"); });
  REQUIRE(eventually([&] { return server.stats().pending_waits == 1; }));
  server.stop();
  REQUIRE(blocked.wait_for(20s) == std::future_status::ready);
  try {
    blocked.get();
    FAIL("get() returned after the server stopped");
  } catch (const ConnectionLostError&) {
  } catch (const TimeoutError&) {
  }
  // The next call tries to reconnect and fails within the connect timeout.
  REQUIRE_THROWS_AS(c.num_keys(), TimeoutError);
}

TEST_CASE("Queues and ping", "[store][integration]") {
  StoreServerThread server(loopback_server());
  StoreClient c("127.0.0.1", server.port(), client_options(Dialect::kModern));
  StoreClient other("127.0.0.1", server.port(), client_options(Dialect::kModern));

  REQUIRE(c.ping() >= std::chrono::microseconds(0));
  REQUIRE(c.queue_len("q") == 0);
  REQUIRE_FALSE(c.queue_pop("q", false, 1s).has_value());
  c.queue_push("q", "one");
  c.queue_push("q", "two");
  c.queue_push("q", std::string("th\0ree", 6));
  REQUIRE(c.queue_len("q") == 3);
  REQUIRE(other.queue_pop("q", false, 1s) == "one");
  REQUIRE(other.queue_pop("q", true, 1s) == "two");
  REQUIRE(c.queue_pop("q", false, 1s) == std::string("th\0ree", 6));
  REQUIRE(c.queue_len("q") == 0);
  REQUIRE_FALSE(c.queue_pop("q", false, 1s).has_value());

  auto popped = std::async(std::launch::async, [&] { return c.queue_pop("q", true, 10s); });
  REQUIRE(eventually([&] { return server.stats().pending_waits == 1; }));
  other.queue_push("q", "late");
  REQUIRE(popped.wait_for(10s) == std::future_status::ready);
  REQUIRE(popped.get() == "late");

  REQUIRE_THROWS_AS(c.queue_pop("q", true, 200ms), TimeoutError);
  other.queue_push("q", "after");
  REQUIRE(c.queue_pop("q", false, 1s) == "after");  // in step after the cancelled wait
  REQUIRE(c.ping() >= std::chrono::microseconds(0));

  StoreClient legacy("127.0.0.1", server.port(), client_options(Dialect::kLegacy));
  REQUIRE_THROWS_AS(legacy.queue_push("q", "x"), InvalidArgumentError);
  REQUIRE_THROWS_AS(legacy.queue_len("q"), InvalidArgumentError);
  REQUIRE_THROWS_AS(legacy.ping(), InvalidArgumentError);
}

TEST_CASE("probe_store: a store that answers is a client; a port nobody listens on is null, with why",
          "[store][integration]") {
  const auto o = probe_options(2s, 2s, nullptr);
  uint16_t gone = 0;
  {
    StoreServerThread server(loopback_server());
    gone = server.port();
    auto client = probe_store({"127.0.0.1", server.port()}, o);
    REQUIRE(client);
    client->set("k", "v");
    CHECK(client->get("k") == "v");
  }
  std::string why;
  CHECK_FALSE(probe_store({"127.0.0.1", gone}, probe_options(300ms, 300ms, nullptr), &why));
  CHECK_THAT(why, Catch::Contains("127.0.0.1:" + std::to_string(gone)));
  // A probe never retries its connection long enough for the client to log it.
  CHECK(probe_options(60s, 60s, nullptr, true).connect_timeout == kMaxProbeConnectTimeout);
  CHECK(probe_options(60s, 60s, nullptr, true).observer);
}

}  // namespace ddprun::rdzv
