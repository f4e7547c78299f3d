// Tests of StoreSession's shared replies: a large value queued for many clients is one buffer, counted once
// on the ledger, and what a client reads is the value as it was when its reply was queued.
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/key_value_state.h"
#include "rendezvous/store/reply_queue.h"
#include "rendezvous/store/store_session.h"
#include "rendezvous/store/wire_codec.h"
#include "tests/rendezvous/store/session_client.h"

namespace ddprun::rdzv {
namespace {

using namespace ddprun::rdzv::session_testing;

const std::string kBig(256 * 1024, 'b');  // well over ReplyQueue::kShareAtBytes

TEST_CASE("a thousand GETs of one large value queue it once", "[store_session][sharing]") {
  KeyValueState state;
  SharedBytes ledger;
  Client writer(state, Dialect::kModern, true, &ledger);
  writer.call(req(Op::kSet, {"/blob"}, {kBig}));
  std::vector<std::unique_ptr<Client>> readers;
  for (int i = 0; i < 1000; ++i) {
    readers.push_back(std::make_unique<Client>(state, Dialect::kLegacy, true, &ledger));
    readers.back()->send(req(Op::kGet, {"/blob"}));
  }
  size_t owned = 0, queued = 0;
  for (const auto& r : readers) {
    owned += r->session().output().owned_bytes();
    queued += r->session().output().size();
  }
  CHECK(owned == 1000 * 8);                   // each reply's length field
  CHECK(queued == 1000 * (kBig.size() + 8));  // what the clients will read
  CHECK(ledger.bytes() == kBig.size());       // the value: once
  CHECK(ledger.buffers() == 1);
  CHECK(Reply(readers[0]->take()).bytes() == kBig);
  readers.clear();
  CHECK(ledger.bytes() == 0);
}

TEST_CASE("a queued reply keeps the value it was queued with", "[store_session][sharing]") {
  KeyValueState state;
  SharedBytes ledger;
  Client writer(state, Dialect::kModern, true, &ledger), reader(state, Dialect::kModern, true, &ledger);
  writer.call(req(Op::kSet, {"/k"}, {kBig}));
  reader.send(req(Op::kGet, {"/k"}));  // not read yet

  const std::string grown = kBig + "tail";
  SECTION("overwritten") {
    writer.call(req(Op::kSet, {"/k"}, {std::string(kBig.size(), 'n')}));
    CHECK(ledger.bytes() == kBig.size());  // the old value lives on for the queued reply only
  }
  SECTION("appended to") {
    writer.call(req(Op::kAppend, {"/k"}, {"tail"}));  // the buffer is shared: a new one is made
    CHECK(get_value(writer, "/k") == grown);
  }
  SECTION("deleted") {
    CHECK(Reply(writer.call(req(Op::kDeleteKey, {"/k"}))).i64() == 1);
  }
  SECTION("compare_set") {
    CHECK(Reply(writer.call(req(Op::kCompareSet, {"/k"}, {kBig, "small"}))).bytes() == "small");
  }
  CHECK(Reply(reader.take()).bytes() == kBig);
  CHECK(ledger.bytes() == 0);
}

TEST_CASE("an unshared value is overwritten in place, a shared one replaced", "[store_session][sharing]") {
  KeyValueState state;
  SharedBytes ledger;
  Client c(state, Dialect::kModern, true, &ledger);
  c.call(req(Op::kSet, {"/k"}, {kBig}));
  const std::string* buffer = state.get("/k");
  c.call(req(Op::kSet, {"/k"}, {"small"}));
  CHECK(state.get("/k") == buffer);  // no reply holds it: reused, as a map of strings would
  c.call(add_req("/n", 1));
  const std::string* counter = state.get("/n");
  c.call(add_req("/n", 1));
  CHECK(state.get("/n") == counter);
  CHECK(*counter == "2");

  c.call(req(Op::kSet, {"/k"}, {kBig}));
  Client reader(state, Dialect::kModern, true, &ledger);
  reader.send(req(Op::kGet, {"/k"}));  // queued, not read: the buffer is referenced
  buffer = state.get("/k");
  c.call(req(Op::kSet, {"/k"}, {"new"}));
  CHECK(state.get("/k") != buffer);
  CHECK(Reply(reader.take()).bytes() == kBig);
}

TEST_CASE("an unshared value is appended to in place", "[store_session][sharing]") {
  KeyValueState state;
  Client c(state, Dialect::kModern);
  c.call(req(Op::kAppend, {"/log"}, {kBig}));
  const std::string* before = state.get("/log");
  c.call(req(Op::kAppend, {"/log"}, {"more"}));
  CHECK(state.get("/log") == before);  // the same buffer, grown
  CHECK(get_value(c, "/log") == kBig + "more");
}

TEST_CASE("a hundred watchers' notifications share the old and the new value", "[store_session][sharing]") {
  KeyValueState state;
  SharedBytes ledger;
  std::vector<std::unique_ptr<Client>> watchers;
  for (int i = 0; i < 100; ++i) {
    watchers.push_back(std::make_unique<Client>(state, Dialect::kLegacy, true, &ledger));
    watchers.back()->call(req(Op::kWatchKey, {"/w"}));
  }
  Client setter(state, Dialect::kLegacy, true, &ledger);
  std::vector<std::string> values;
  for (char c : {'1', '2', '3', '4', '5'}) {
    values.emplace_back(kBig.size(), c);
    setter.call(req(Op::kSet, {"/w"}, {values.back()}));
  }
  CHECK(ledger.bytes() == 5 * kBig.size());  // five values, not 100 x 5 x 2
  CHECK(ledger.buffers() == 5);
  for (const auto& w : watchers) CHECK(w->async() == 5);
  Reply ev(watchers[42]->take());
  for (size_t i = 0; i < values.size(); ++i) {
    CHECK(ev.u8() == uint8_t(i == 0 ? WatchEvent::kKeyCreated : WatchEvent::kKeyUpdated));
    CHECK(ev.bytes() == "/w");
    CHECK(ev.bytes() == (i == 0 ? std::string() : values[i - 1]));
    CHECK(ev.bytes() == values[i]);
  }
  CHECK(ev.remaining() == 0);
}

TEST_CASE("MULTI_GET and QUEUE_POP replies reference their values", "[store_session][sharing]") {
  KeyValueState state;
  SharedBytes ledger;
  Client c(state, Dialect::kModern, true, &ledger);
  c.call(req(Op::kSet, {"/a"}, {kBig}));
  c.call(req(Op::kQueuePush, {"/q"}, {kBig + "!"}));
  c.send(req(Op::kMultiGet, {"/a", "/missing", "/a"}));
  c.send(req(Op::kQueuePop, {"/q"}));
  CHECK(ledger.bytes() == 2 * kBig.size() + 1);
  CHECK(c.session().output().owned_bytes() == 3 * 8 + 8 + 8);
  Reply r(c.take());
  CHECK(r.bytes() == kBig);
  CHECK(r.bytes().empty());
  CHECK(r.bytes() == kBig);
  CHECK(r.i64() == 1);
  CHECK(r.bytes() == kBig + "!");
  CHECK(ledger.bytes() == 0);
}

}  // namespace
}  // namespace ddprun::rdzv
