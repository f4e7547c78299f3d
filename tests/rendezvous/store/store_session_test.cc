// Tests of StoreSession: encoded requests in, reply bytes out, checked field by field with WireReader.
#include "rendezvous/store/store_session.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/key_value_state.h"
#include "rendezvous/store/wire_codec.h"
#include "tests/rendezvous/store/session_client.h"

namespace ddprun::rdzv {
namespace {

using Catch::Contains;  // the string matcher (catch_compat.h)
using namespace ddprun::rdzv::session_testing;

TEST_CASE("replies of the ops every dialect has", "[store_session]") {
  Dialect d = GENERATE(Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern);
  INFO(dialect_name(d));
  KeyValueState state;
  Client c(state, d);

  CHECK(c.call(req(Op::kSet, {"/k"}, {"v"})).empty());  // SET: no reply
  {
    Reply r(c.call(req(Op::kGet, {"/k"})));
    CHECK(r.bytes() == "v");
    CHECK(r.remaining() == 0);
  }
  {
    Reply r(c.call(req(Op::kGet, {"/missing"})));
    CHECK(r.bytes() == "");
    CHECK(r.remaining() == 0);
  }
  CHECK(c.call(add_req("/n", 5)) == std::string("\x05\0\0\0\0\0\0\0", 8));
  {
    Reply r(c.call(add_req("/n", -7)));
    CHECK(r.i64() == -2);
    CHECK(r.remaining() == 0);
  }
  CHECK(c.call(req(Op::kCheck, {"/k", "/n"})) == std::string(1, char(kCheckReady)));
  CHECK(c.call(req(Op::kCheck, {"/k", "/x"})) == std::string(1, char(kCheckNotReady)));
  CHECK(c.call(req(Op::kWait, {"/k", "/n"})) == std::string(1, char(kWaitStopWaiting)));
  {
    Reply r(c.call(req(Op::kGetNumKeys)));
    CHECK(r.i64() == 2);
    CHECK(r.remaining() == 0);
  }
  auto cas = [&](std::string key, std::string expected, std::string desired) {
    Reply r(c.call(req(Op::kCompareSet, {std::move(key)}, {std::move(expected), std::move(desired)})));
    std::string v = r.bytes();
    CHECK(r.remaining() == 0);
    return v;
  };
  CHECK(cas("/k", "v", "w") == "w");
  CHECK(cas("/k", "zz", "q") == "w");
  CHECK(cas("/new", "", "x") == "x");
  CHECK(cas("/absent", "e", "d") == "e");
  {
    Reply r(c.call(req(Op::kDeleteKey, {"/k"})));
    CHECK(r.i64() == 1);
    CHECK(r.remaining() == 0);
  }
  {
    Reply r(c.call(req(Op::kDeleteKey, {"/k"})));
    CHECK(r.i64() == 0);
    CHECK(r.remaining() == 0);
  }
  {
    Reply r(c.call(req(Op::kGetNumKeys)));
    CHECK(r.i64() == 2);  // /n and /new
  }
  CHECK(c.async() == 0);
}

TEST_CASE("an agent's live key ends with its session; other keys stay", "[store_session]") {
  KeyValueState state;
  Client observer(state, Dialect::kModern);
  {
    Client agent(state, Dialect::kModern);
    agent.call(req(Op::kSet, {"/ddprun/job/live/h1:7"}, {"1"}));
    agent.call(req(Op::kSet, {"/ddprun/job/r0/node/0"}, {"h1:7|-1|2|"}));
    CHECK(get_value(observer, "/ddprun/job/live/h1:7") == "1");
  }  // the connection closed
  CHECK(state.get("/ddprun/job/live/h1:7") == nullptr);
  CHECK(get_value(observer, "/ddprun/job/r0/node/0") == "h1:7|-1|2|");
}

TEST_CASE("legacy WATCH_KEY acknowledges, then pushes changes made by another session", "[store_session]") {
  KeyValueState state;
  Client writer(state, Dialect::kLegacy);
  {
    Client watcher(state, Dialect::kLegacy);
    CHECK(watcher.call(req(Op::kWatchKey, {"/k"})) == std::string(1, char(WatchEvent::kCallbackRegistered)));
    CHECK(state.watches() == 1);

    auto expect_event = [&](WatchEvent ev, const std::string& old_v, const std::string& new_v) {
      Reply r(watcher.take());
      CHECK(r.u8() == uint8_t(ev));
      CHECK(r.bytes() == "/k");
      CHECK(r.bytes() == old_v);
      CHECK(r.bytes() == new_v);
      CHECK(r.remaining() == 0);
    };
    CHECK(writer.call(req(Op::kSet, {"/k"}, {"1"})).empty());
    CHECK(watcher.async() == 1);
    expect_event(WatchEvent::kKeyCreated, "", "1");

    CHECK(writer.call(req(Op::kSet, {"/other"}, {"x"})).empty());
    CHECK(watcher.async() == 1);
    CHECK(watcher.take().empty());

    writer.call(add_req("/k", 4));
    CHECK(watcher.async() == 2);
    expect_event(WatchEvent::kKeyUpdated, "1", "5");

    Reply del(writer.call(req(Op::kDeleteKey, {"/k"})));
    CHECK(del.i64() == 1);
    CHECK(watcher.async() == 3);
    expect_event(WatchEvent::kKeyDeleted, "5", "");
  }
  // The watcher's session is gone: so is its watch.
  CHECK(state.watches() == 0);
  CHECK(writer.call(req(Op::kSet, {"/k"}, {"2"})).empty());
}

TEST_CASE("modern VALIDATE and PING", "[store_session]") {
  KeyValueState state;
  Client c(state, Dialect::kModern, /*forced=*/false);
  CHECK_FALSE(c.session().dialect().has_value());
  CHECK(c.call(numbered(Op::kValidate, kValidationMagic)).empty());
  CHECK(c.session().dialect() == Dialect::kModern);
  CHECK(c.call(numbered(Op::kPing, 0x01020304)) == std::string("\x04\x03\x02\x01", 4));
  Reply r(c.call(numbered(Op::kPing, 0xFFFFFFFE)));
  CHECK(r.u32() == 0xFFFFFFFE);
  CHECK(r.remaining() == 0);
}

TEST_CASE("APPEND, MULTI_SET, MULTI_GET, CANCEL_WAIT replies", "[store_session]") {
  Dialect d = GENERATE(Dialect::kMid2023, Dialect::kModern);
  INFO(dialect_name(d));
  KeyValueState state;
  Client c(state, d);
  CHECK(c.call(req(Op::kAppend, {"/a"}, {"x"})).empty());
  CHECK(c.call(req(Op::kAppend, {"/a"}, {"yz"})).empty());
  CHECK(c.call(req(Op::kMultiSet, {"/m1", "/m2"}, {"1", "22"})).empty());
  {
    Reply r(c.call(req(Op::kMultiGet, {"/m1", "/missing", "/m2", "/a"})));
    CHECK(r.bytes() == "1");
    CHECK(r.bytes() == "");
    CHECK(r.bytes() == "22");
    CHECK(r.bytes() == "xyz");
    CHECK(r.remaining() == 0);
  }
  CHECK(c.call(req(Op::kMultiGet, {})).empty());
  // CANCEL_WAIT with nothing pending still answers WAIT_CANCELED.
  CHECK(c.call(req(Op::kCancelWait)) == std::string(1, char(kWaitCanceled)));
}

TEST_CASE("modern queues", "[store_session]") {
  KeyValueState state;
  Client c(state, Dialect::kModern);
  CHECK(c.call(req(Op::kQueuePush, {"/q"}, {"a"})).empty());
  CHECK(c.call(req(Op::kQueuePush, {"/q"}, {"bb"})).empty());
  {
    Reply r(c.call(req(Op::kQueueLen, {"/q"})));
    CHECK(r.i64() == 2);
    CHECK(r.remaining() == 0);
  }
  {
    Reply r(c.call(req(Op::kQueuePop, {"/q"})));
    CHECK(r.i64() == 2);  // the length before the pop
    CHECK(r.bytes() == "a");
    CHECK(r.remaining() == 0);
  }
  {
    Reply r(c.call(req(Op::kQueuePop, {"/q"})));
    CHECK(r.i64() == 1);
    CHECK(r.bytes() == "bb");
    CHECK(r.remaining() == 0);
  }
  CHECK(c.call(req(Op::kQueuePop, {"/q"})) == std::string(8, '\0'));  // empty: i64 0 and nothing else
  CHECK(c.call(req(Op::kQueueLen, {"/q"})) == std::string(8, '\0'));
}

TEST_CASE("a WAIT is answered when another session writes the last key", "[store_session]") {
  Dialect d = GENERATE(Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern);
  INFO(dialect_name(d));
  KeyValueState state;
  Client a(state, d);
  Client b(state, d);
  CHECK(a.call(req(Op::kWait, {"/x", "/y"})).empty());
  CHECK(a.session().pending_waits() == 1);
  CHECK(state.pending_waits() == 1);

  b.call(req(Op::kSet, {"/x"}, {"1"}));
  CHECK(a.async() == 0);
  CHECK(a.take().empty());

  b.call(add_req("/y", 1));
  CHECK(a.async() == 1);
  CHECK(a.take() == std::string(1, char(kWaitStopWaiting)));
  CHECK(a.session().pending_waits() == 0);
  CHECK(state.pending_waits() == 0);

  b.call(req(Op::kSet, {"/y"}, {"2"}));
  CHECK(a.async() == 1);
  CHECK(a.take().empty());
}

TEST_CASE("CANCEL_WAIT answers 1 and the cancelled wait never fires", "[store_session]") {
  Dialect d = GENERATE(Dialect::kMid2023, Dialect::kModern);
  INFO(dialect_name(d));
  KeyValueState state;
  Client a(state, d);
  Client b(state, d);
  CHECK(a.call(req(Op::kWait, {"/x"})).empty());
  CHECK(a.call(req(Op::kWait, {"/y"})).empty());
  CHECK(a.session().pending_waits() == 2);
  CHECK(a.call(req(Op::kCancelWait)) == std::string(1, char(kWaitCanceled)));
  CHECK(a.session().pending_waits() == 0);
  CHECK(state.pending_waits() == 0);
  b.call(req(Op::kSet, {"/x"}, {"1"}));
  b.call(req(Op::kSet, {"/y"}, {"1"}));
  CHECK(a.async() == 0);
  CHECK(a.take().empty());

  // A wait that fired before the cancel sent its 0 first.
  CHECK(a.call(req(Op::kWait, {"/z"})).empty());
  b.call(req(Op::kSet, {"/z"}, {"1"}));
  CHECK(a.async() == 1);
  CHECK(a.call(req(Op::kCancelWait)) == std::string("\x00\x01", 2));
}

TEST_CASE("a WAIT satisfied by the same session's later request", "[store_session]") {
  KeyValueState state;
  Client a(state, Dialect::kModern);
  std::string bytes = encode(Dialect::kModern, req(Op::kWait, {"/x"})) +
                      encode(Dialect::kModern, req(Op::kSet, {"/x"}, {"v"}));
  auto res = a.session().consume(span_of(bytes));
  CHECK(res.error.empty());
  CHECK(res.requests == 2);
  CHECK(res.consumed == bytes.size());
  CHECK(a.take() == std::string(1, char(kWaitStopWaiting)));
  CHECK(state.pending_waits() == 0);
}

TEST_CASE("destroying a session forgets its pending waits", "[store_session]") {
  KeyValueState state;
  Client b(state, Dialect::kLegacy);
  {
    auto a = std::make_unique<Client>(state, Dialect::kLegacy);
    CHECK(a->call(req(Op::kWait, {"/x"})).empty());
    CHECK(a->call(req(Op::kWait, {"/x", "/y"})).empty());
    CHECK(state.pending_waits() == 2);
    a.reset();
  }
  CHECK(state.pending_waits() == 0);
  // Writing the key afterwards must not reach the destroyed session.
  CHECK(b.call(req(Op::kSet, {"/x"}, {"1"})).empty());
  CHECK(b.call(req(Op::kSet, {"/y"}, {"1"})).empty());
  CHECK(state.pending_waits() == 0);
}

TEST_CASE("only whole requests are consumed", "[store_session]") {
  KeyValueState state;
  StoreSession s(state, WireLimits{}, Dialect::kModern, nullptr);
  const std::string set = encode(Dialect::kModern, req(Op::kSet, {"/k"}, {"value"}));
  const std::string get = encode(Dialect::kModern, req(Op::kGet, {"/k"}));
  const std::string all = set + get;

  auto r1 = s.consume(span_of(all).first(set.size() + 3));
  CHECK(r1.error.empty());
  CHECK(r1.consumed == set.size());
  CHECK(r1.requests == 1);
  CHECK(s.output().empty());

  auto r2 = s.consume(span_of(all).subspan(r1.consumed));
  CHECK(r2.error.empty());
  CHECK(r2.consumed == get.size());
  CHECK(r2.requests == 1);
  Reply reply(s.output().flatten());
  CHECK(reply.bytes() == "value");
  CHECK(reply.remaining() == 0);
}

TEST_CASE("a byte-at-a-time torch 1.13 stream is served as the bytes arrive", "[store_session]") {
  KeyValueState state;
  StoreSession s(state, WireLimits{}, std::nullopt, nullptr);
  // set("k", "v") as traced from torch 1.13, then get("k").
  const std::string stream = std::string("\x00\x02\0\0\0\0\0\0\0/k\x01\0\0\0\0\0\0\0v", 20) +
                             std::string("\x02\x02\0\0\0\0\0\0\0/k", 11);
  std::string buffer;
  size_t requests = 0;
  for (size_t i = 0; i < stream.size(); ++i) {
    buffer.push_back(stream[i]);
    auto r = s.consume(span_of(buffer));
    REQUIRE(r.error.empty());
    buffer.erase(0, r.consumed);
    requests += r.requests;
    if (i == 19) CHECK(requests == 1);
    if (i < 19) CHECK(requests == 0);
  }
  CHECK(buffer.empty());
  CHECK(requests == 2);
  CHECK(s.dialect() == Dialect::kLegacy);
  CHECK(state.num_keys() == 1);
  Reply reply(s.output().flatten());
  CHECK(reply.bytes() == "v");
  CHECK(reply.remaining() == 0);
}

TEST_CASE("a garbage byte is an error and stops the session's parsing", "[store_session]") {
  KeyValueState state;
  StoreSession s(state, WireLimits{}, Dialect::kModern, nullptr);
  const std::string ping = encode(Dialect::kModern, numbered(Op::kPing, 7));
  const std::string input = ping + "\xee" + ping;
  auto r = s.consume(span_of(input));
  CHECK_THAT(r.error, Contains("0xee") && Contains("modern"));
  CHECK(r.consumed == ping.size());
  CHECK(r.requests == 1);
  CHECK(s.output().flatten() == std::string("\x07\0\0\0", 4));  // only the first PING was answered
}

TEST_CASE("ADD on a non-integer value is an error naming the key", "[store_session]") {
  KeyValueState state;
  StoreSession s(state, WireLimits{}, Dialect::kLegacy, nullptr);
  const std::string set = encode(Dialect::kLegacy, req(Op::kSet, {"/counter"}, {"abc"}));
  const std::string add = encode(Dialect::kLegacy, add_req("/counter", 1));
  const std::string get = encode(Dialect::kLegacy, req(Op::kGet, {"/counter"}));
  const std::string input = set + add + get;
  auto r = s.consume(span_of(input));
  CHECK_THAT(r.error, Contains("'/counter'") && Contains("ADD"));
  CHECK(r.consumed <= set.size() + add.size());
  CHECK(s.output().empty());  // no ADD reply, and the GET after it was not served
  REQUIRE(state.get("/counter") != nullptr);
  CHECK(*state.get("/counter") == "abc");
}

}  // namespace
}  // namespace ddprun::rdzv
