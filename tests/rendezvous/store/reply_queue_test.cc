// Tests of ReplyQueue and SharedBytes: copied and shared pieces in order, each shared buffer counted once.
#include "rendezvous/store/reply_queue.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv {
namespace {

std::string wire_bytes(std::string_view v) {
  std::string out;
  WireWriter(out).bytes(v);
  return out;
}

TEST_CASE("ReplyQueue: small fields and values are copied, large values referenced", "[reply_queue]") {
  SharedBytes ledger;
  ReplyQueue q(&ledger, 8);
  const SharedValue small = make_shared_value("1234567");  // under share_at: copied
  const SharedValue large = make_shared_value("123456789");
  q.u8(3);
  q.bytes(small);
  q.bytes(large);
  q.i64(-1);
  q.bytes(SharedValue());  // no value: the empty string
  q.bytes(std::string_view("literal"));

  std::string expected(1, '\3');
  expected += wire_bytes("1234567") + wire_bytes("123456789");
  WireWriter(expected).i64(-1);
  expected += wire_bytes("") + wire_bytes("literal");
  CHECK(q.flatten() == expected);
  CHECK(q.size() == expected.size());
  CHECK(q.owned_bytes() == expected.size() - 9);
  CHECK(q.pieces() == 3);  // copied bytes, the large value, copied bytes
  CHECK(ledger.bytes() == 9);
  CHECK(ledger.buffers() == 1);
  CHECK(large.use_count() == 2);  // the queue holds it

  q.clear();
  CHECK(q.empty());
  CHECK(q.flatten().empty());
  CHECK(ledger.bytes() == 0);
  CHECK(large.use_count() == 1);
}

TEST_CASE("SharedBytes: a buffer counts once however many queues reference it", "[reply_queue]") {
  SharedBytes ledger;
  const SharedValue value = make_shared_value(std::string(1 << 20, 'v'));
  std::vector<std::unique_ptr<ReplyQueue>> queues;
  for (int i = 0; i < 100; ++i) {
    queues.push_back(std::make_unique<ReplyQueue>(&ledger));
    queues.back()->bytes(value);
    queues.back()->bytes(value);  // twice in one queue, too
  }
  CHECK(ledger.bytes() == value->size());
  CHECK(ledger.buffers() == 1);
  size_t logical = 0;
  for (const auto& q : queues) logical += q->size();
  CHECK(logical == 200 * (value->size() + 8));  // what the clients will read

  // The bytes stay counted while any queue references them, and go with the last one.
  for (size_t i = 0; i + 1 < queues.size(); ++i) queues[i]->clear();
  CHECK(ledger.bytes() == value->size());
  queues.back().reset();
  CHECK(ledger.bytes() == 0);
  CHECK(ledger.buffers() == 0);
}

TEST_CASE("ReplyQueue: swap hands the queued pieces over; for_each_piece walks them in order",
          "[reply_queue]") {
  SharedBytes ledger;
  ReplyQueue session(&ledger, 4), writing(&ledger, 4);
  const SharedValue v = make_shared_value("shared!");
  session.u8(1);
  session.bytes(v);
  writing.swap(session);
  CHECK(session.empty());
  CHECK(writing.size() == 1 + 8 + 7);
  std::vector<std::string> pieces;
  std::vector<const char*> at;
  writing.for_each_piece([&](const char* p, size_t n) {
    pieces.emplace_back(p, n);
    at.push_back(p);
  });
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0] == std::string(1, '\1') + std::string("\7\0\0\0\0\0\0\0", 8));
  CHECK(pieces[1] == "shared!");
  CHECK(at[1] == v->data());  // the stored value itself, not a copy
  size_t shared = 0;
  writing.for_each_shared([&](const std::string& b) {
    CHECK(&b == v.get());
    ++shared;
  });
  CHECK(shared == 1);
  CHECK(ledger.bytes() == 7);
}

TEST_CASE("ReplyQueue without a ledger references values too", "[reply_queue]") {
  ReplyQueue q;
  const SharedValue v = make_shared_value(std::string(ReplyQueue::kShareAtBytes, 'x'));
  q.bytes(v);
  CHECK(q.owned_bytes() == 8);
  CHECK(v.use_count() == 2);
}

}  // namespace
}  // namespace ddprun::rdzv
