// Integration tests: clients that do not read what the store owes them (replies, WAIT completions, WATCH_KEY
// notifications), alone or by the hundred. A value queued for many clients is one buffer in the store's
// memory (rendezvous/reply_queue.h); a client past its own output limit, or the clients holding the most when
// all together pass the memory budget, are dropped; every other client keeps being served and no stored key
// is lost. Bounds are checked through the server's own accounting (StoreServerStats), never through time.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/wire_codec.h"
#include "tests/rendezvous/store/hostile_fixture.h"

namespace ddprun::rdzv {

using namespace ddprun::rdzv::hostile;

namespace {

// A server with `budget` bytes for its clients, and a request timeout a loaded machine cannot reach while
// passing a SET of megabytes (the budget must act, not the timeout).
StoreServerOptions budgeted(size_t budget) {
  StoreServerOptions o;
  o.memory_budget = budget;
  o.request_timeout = 60s;
  return o;
}

}  // namespace

TEST_CASE("Hostile reader: a hundred watchers that never read hold each value once",
          "[store][hostile][integration]") {
  // Each of 5 SETs of 2 MiB notifies 100 watchers with the old and the new value: 2 GB of notifications if
  // each were a copy (the store's RSS grew by 1.2 GB before values were shared). Shared: the 5 values.
  const StoreServerOptions options = budgeted(64 * kMiB);
  Fixture f(options);
  auto watchers = silent_watchers(f.server.port(), 100, "/w");
  StoreClient setter("127.0.0.1", f.server.port(), client_options(Dialect::kLegacy));
  std::vector<std::string> values;
  for (char c : {'1', '2', '3', '4', '5'}) {
    values.emplace_back(2 * kMiB, c);
    setter.set("w", values.back());
  }
  REQUIRE(setter.add("counter", 0) == 7);  // served after the SETs: every notification is queued by now
  const auto stats = f.server.stats();
  CAPTURE(stats.shared_bytes, stats.buffered_bytes, stats.peak_buffered_bytes);
  CHECK(stats.dropped == 0);
  CHECK(stats.shared_bytes <= 5 * 2 * kMiB);
  // The values, a SET's unfinished input, and each watcher's few copied bytes: far under the budget.
  CHECK(stats.peak_buffered_bytes <= 16 * kMiB);
  f.require_healthy(4);

  // What the watchers read, once they do, is every notification, byte for byte.
  for (size_t i : {size_t{0}, size_t{99}}) {
    std::string expected;
    for (size_t v = 0; v < values.size(); ++v) {
      expected += notification(v == 0 ? WatchEvent::kKeyCreated : WatchEvent::kKeyUpdated, "/w",
                               v == 0 ? std::string() : values[v - 1], values[v]);
    }
    const std::string got = watchers[i]->read(expected.size(), 30s);
    CAPTURE(i, got.size());
    REQUIRE(got.size() == expected.size());
    REQUIRE((got == expected));  // in parentheses: Catch would print megabytes on a mismatch
  }
  watchers.clear();
  REQUIRE(eventually([&] { return f.server.stats().shared_bytes == 0; }));
  REQUIRE(setter.delete_key("w"));
}

TEST_CASE("Hostile reader: two hundred clients reading one large value slowly hold it once",
          "[store][hostile][integration]") {
  // 200 GETs of a 4 MiB value, none read at first: 800 MiB of replies if each were a copy (the budget, 64
  // MiB, would have dropped most of them). Shared: the value, once, and the fresh client is served meanwhile.
  const StoreServerOptions options = budgeted(64 * kMiB);
  Fixture f(options);
  const std::string blob(4 * kMiB, 'z');
  StoreClient setter("127.0.0.1", f.server.port(), client_options(Dialect::kLegacy));
  setter.set("blob", blob);
  REQUIRE(setter.num_keys() == 4);  // answered after the SET: the value is stored before anyone GETs it
  const uint64_t requests = f.server.stats().requests;
  const std::string get = encoded(Dialect::kLegacy, Request{.op = Op::kGet, .keys = {"/blob"}});
  std::vector<std::unique_ptr<RawSocket>> readers;
  for (size_t i = 0; i < 200; ++i) {
    readers.push_back(attacker(f.server.port(), i, 200));
    REQUIRE(readers.back()->send(get));
  }
  REQUIRE(eventually([&] { return f.server.stats().requests >= requests + 200; }));
  const auto stats = f.server.stats();
  CAPTURE(stats.shared_bytes, stats.buffered_bytes, stats.peak_buffered_bytes);
  CHECK(stats.dropped == 0);
  CHECK(stats.shared_bytes <= blob.size());
  CHECK(stats.peak_buffered_bytes <= 12 * kMiB);  // the value, the SET's input, 200 length fields
  f.require_healthy(4);
  // The first and the last reader, once they read, get the whole value.
  const std::string expected = string_field(blob);
  for (size_t i : {size_t{0}, readers.size() - 1}) {
    const std::string got = readers[i]->read(expected.size(), 30s);
    CAPTURE(i, got.size());
    REQUIRE(got.size() == expected.size());
    REQUIRE((got == expected));  // in parentheses: Catch would print megabytes on a mismatch
  }
  readers.clear();
  REQUIRE(eventually([&] { return f.server.stats().shared_bytes == 0; }));
  REQUIRE(f.server.stats().dropped == 0);
}

TEST_CASE("Hostile reader: watchers that never read are dropped once the values they hold pass the budget",
          "[store][hostile][integration]") {
  // Every SET of a new value leaves the old one held by the watchers' queues: 8 watchers and 512 KiB values
  // pass an 8 MiB budget after 16 SETs. The watchers, each over its share, are dropped; the writer is not.
  const StoreServerOptions options = budgeted(8 * kMiB);
  Fixture f(options);
  auto watchers = silent_watchers(f.server.port(), 8, "/w", /*all_slow=*/true);  // all hold alike
  StoreClient setter("127.0.0.1", f.server.port(), client_options(Dialect::kLegacy));
  std::string value;
  for (int i = 0; i < 64 && f.server.stats().dropped == 0; ++i) {
    value = std::string(kMiB / 2, static_cast<char>('a' + i % 26)) + std::to_string(i);
    setter.set("w", value);
  }
  REQUIRE(eventually([&] { return f.server.stats().dropped == 8; }));
  for (auto& w : watchers) REQUIRE(w->wait_closed());
  const auto stats = f.server.stats();
  CAPTURE(stats.peak_buffered_bytes);
  // At most the budget, one more value and the SET that brought it.
  CHECK(stats.peak_buffered_bytes <= options.memory_budget + 2 * kMiB);
  REQUIRE(eventually([&] { return f.server.stats().buffered_bytes <= options.memory_budget; }));
  REQUIRE((setter.get("w") == value));  // stored data is never dropped
  REQUIRE(setter.delete_key("w"));
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

TEST_CASE("Hostile client: unfinished requests count against the memory budget",
          "[store][hostile][integration]") {
  // 16 clients each send 15 of the 16 MiB of a SET they declared, then stall: 240 MiB held without a budget.
  const StoreServerOptions options = budgeted(64 << 20);
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
