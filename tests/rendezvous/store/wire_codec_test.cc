// Byte-level tests of the TCPStore wire codec: command tables, encoding, unknown bytes, and the
// little-endian field layout of WireWriter/WireReader. Incremental parsing, dialect detection and limits:
// wire_parser_test.cc.
#include "rendezvous/store/wire_codec.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "wire_test_util.h"

namespace ddprun::rdzv {
namespace {

using namespace wire_test;  // the shared helpers of wire_test_util.h

TEST_CASE("command bytes match PyTorch's numbering in each dialect", "[wire_codec]") {
  struct Row {
    Op op;
    int legacy, mid2023, modern;  // -1: absent
  };
  const Row rows[] = {
      {Op::kValidate, -1, -1, 0},   {Op::kSet, 0, 0, 1},           {Op::kCompareSet, 1, 1, 2},
      {Op::kGet, 2, 2, 3},          {Op::kAdd, 3, 3, 4},           {Op::kCheck, 4, 4, 5},
      {Op::kWait, 5, 5, 6},         {Op::kGetNumKeys, 6, 6, 7},    {Op::kWatchKey, 7, -1, -1},
      {Op::kDeleteKey, 8, 7, 8},    {Op::kAppend, -1, 8, 9},       {Op::kMultiGet, -1, 9, 10},
      {Op::kMultiSet, -1, 10, 11},  {Op::kCancelWait, -1, 11, 12}, {Op::kPing, -1, -1, 13},
      {Op::kQueuePush, -1, -1, 14}, {Op::kQueuePop, -1, -1, 15},   {Op::kQueueLen, -1, -1, 16},
      {Op::kListKeys, -1, -1, 17},
  };
  for (const Row& row : rows) {
    INFO(op_name(row.op));
    const int expected[] = {row.legacy, row.mid2023, row.modern};
    for (int i = 0; i < 3; ++i) {
      auto b = op_to_byte(kDialects[i], row.op);
      if (expected[i] < 0) {
        CHECK_FALSE(b.has_value());
      } else {
        REQUIRE(b.has_value());
        CHECK(int(*b) == expected[i]);
      }
    }
  }
}

TEST_CASE("op_from_byte is the inverse of op_to_byte for all 256 bytes", "[wire_codec]") {
  Dialect d = GENERATE(Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern);
  INFO(dialect_name(d));
  int known = 0;
  for (int b = 0; b < 256; ++b) {
    INFO("byte " << b);
    auto op = op_from_byte(d, static_cast<uint8_t>(b));
    if (op) {
      ++known;
      CHECK(op_to_byte(d, *op) == static_cast<uint8_t>(b));
    }
  }
  int supported = 0;
  for (int i = 0; i < kNumOps; ++i) supported += op_to_byte(d, static_cast<Op>(i)).has_value();
  CHECK(known == supported);
}

TEST_CASE("dialect names round-trip", "[wire_codec]") {
  for (Dialect d : kDialects) CHECK(parse_dialect(dialect_name(d)) == d);
  CHECK(dialect_name(Dialect::kMid2023) == "mid2023");
  CHECK_FALSE(parse_dialect("Legacy").has_value());
  CHECK_FALSE(parse_dialect("").has_value());
  CHECK(op_name(Op::kCompareSet) == "COMPARE_SET");
  CHECK(op_name(Op::kQueueLen) == "QUEUE_LEN");
}

TEST_CASE("torch 1.13 trace of set(\"k\",\"v\") parses to SET", "[wire_codec]") {
  const std::string trace = from_hex("00 0200000000000000 2f6b 0100000000000000 76");
  REQUIRE(trace.size() == 20);
  RequestParser parser(WireLimits{});
  Request req;
  ParseResult r = parser.parse(span_of(trace), req);
  REQUIRE(r.status == ParseStatus::kDone);
  CHECK(r.consumed == 20);
  CHECK(parser.dialect() == Dialect::kLegacy);
  CHECK(req.op == Op::kSet);
  CHECK(req.keys == std::vector<std::string>{"/k"});
  CHECK(req.values == std::vector<std::string>{"v"});

  // And the client side produces exactly these bytes.
  std::string encoded;
  REQUIRE(encode_request(Dialect::kLegacy, req, encoded));
  CHECK(encoded == trace);
}

TEST_CASE("encode_request then parse round-trips every op of every dialect", "[wire_codec]") {
  Dialect d = GENERATE(Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern);
  Op op = static_cast<Op>(GENERATE(range(0, kNumOps)));
  INFO(dialect_name(d) << " " << op_name(op));
  auto byte = op_to_byte(d, op);
  const Request req = sample(op);
  std::string bytes;
  if (!byte) {
    CHECK_FALSE(encode_request(d, req, bytes));
    CHECK(bytes.empty());
    return;
  }
  REQUIRE(encode_request(d, req, bytes));
  REQUIRE(!bytes.empty());
  CHECK(uint8_t(bytes[0]) == *byte);
  Request out;
  out.delta = 99;  // stale content must not survive
  out.keys = {"stale"};
  ParseResult r = parse_forced(d, bytes, out);
  REQUIRE(r.status == ParseStatus::kDone);
  CHECK(r.consumed == bytes.size());
  CHECK(r.error.empty());
  CHECK(out.op == req.op);
  CHECK(out.keys == req.keys);
  CHECK(out.values == req.values);
  CHECK(out.delta == req.delta);
  CHECK(out.number == req.number);
  CHECK(out == req);
}

TEST_CASE("field layout of encoded requests", "[wire_codec]") {
  std::string out;
  Request add{.op = Op::kAdd, .keys = {"ab"}, .delta = -2};
  REQUIRE(encode_request(Dialect::kModern, add, out));
  CHECK(out == from_hex("04 0200000000000000 6162 feffffffffffffff"));

  out.clear();
  Request wait{.op = Op::kWait, .keys = {"x", "yz"}};
  REQUIRE(encode_request(Dialect::kLegacy, wait, out));
  CHECK(out == from_hex("05 0200000000000000 0100000000000000 78 0200000000000000 797a"));

  out.clear();
  Request multi_set{.op = Op::kMultiSet, .keys = {"k"}, .values = {"v"}};
  REQUIRE(encode_request(Dialect::kMid2023, multi_set, out));
  CHECK(out == from_hex("0a 0100000000000000 0100000000000000 6b 0100000000000000 76"));

  out.clear();
  Request ping{.op = Op::kPing, .number = 0x01020304};
  REQUIRE(encode_request(Dialect::kModern, ping, out));
  CHECK(out == from_hex("0d 04030201"));

  out.clear();
  Request validate{.op = Op::kValidate, .number = kValidationMagic};
  REQUIRE(encode_request(Dialect::kModern, validate, out));
  CHECK(out == from_hex("00 cef7853c"));
}

TEST_CASE("unknown command bytes are errors naming the byte and the dialect", "[wire_codec]") {
  struct Case {
    Dialect d;
    uint8_t byte;
    const char* hex;
  };
  const Case cases[] = {
      {Dialect::kLegacy, 0x09, "0x09"},  {Dialect::kLegacy, 0x0d, "0x0d"},  {Dialect::kLegacy, 0xff, "0xff"},
      {Dialect::kMid2023, 0x0c, "0x0c"}, {Dialect::kMid2023, 0xff, "0xff"}, {Dialect::kModern, 0x12, "0x12"},
      {Dialect::kModern, 0x80, "0x80"},  {Dialect::kModern, 0xff, "0xff"},
  };
  for (const Case& c : cases) {
    INFO(dialect_name(c.d) << " " << c.hex);
    // The byte is followed by plenty of zeros, so a wrongly accepted op could parse to completion.
    std::string bytes(1, static_cast<char>(c.byte));
    bytes.append(64, '\0');
    Request out;
    ParseResult r = parse_forced(c.d, bytes, out);
    CHECK(r.status == ParseStatus::kError);
    CHECK_THAT(r.error, Contains(c.hex) && Contains(std::string(dialect_name(c.d))));
    CHECK(r.consumed == 0);
  }
}

TEST_CASE("WireWriter writes little-endian fields", "[wire_codec]") {
  std::string out;
  WireWriter w(out);
  w.u8(0xAB);
  w.u32(0x01020304);
  w.u64(0x0102030405060708);
  w.i64(-2);
  w.bytes(std::string_view("hi"));
  w.bytes("");
  CHECK(out ==
        from_hex("ab 04030201 0807060504030201 feffffffffffffff 0200000000000000 6869 0000000000000000"));
}

TEST_CASE("WireReader reads what WireWriter wrote and never moves on failure", "[wire_codec]") {
  std::string buf;
  WireWriter w(buf);
  w.u8(7);
  w.u32(0xDEADBEEF);
  w.u64(std::numeric_limits<uint64_t>::max());
  w.i64(std::numeric_limits<int64_t>::min());
  w.bytes(std::string("a\0b", 3));

  WireReader r(span_of(buf));
  uint8_t a = 0;
  uint32_t b = 0;
  uint64_t c = 0, peeked = 0;
  int64_t d = 0;
  std::string s;
  REQUIRE(r.u8(a));
  CHECK(a == 7);
  REQUIRE(r.u32(b));
  CHECK(b == 0xDEADBEEF);
  REQUIRE(r.peek_u64(peeked));
  CHECK(r.position() == 5);
  REQUIRE(r.u64(c));
  CHECK(c == peeked);
  CHECK(c == std::numeric_limits<uint64_t>::max());
  REQUIRE(r.i64(d));
  CHECK(d == std::numeric_limits<int64_t>::min());
  CHECK(r.bytes(s, 2) == WireReader::BytesStatus::kTooLong);
  CHECK(r.position() == 21);
  REQUIRE(r.bytes(s, 3) == WireReader::BytesStatus::kOk);
  CHECK(s == std::string("a\0b", 3));
  CHECK(r.remaining() == 0);
  CHECK_FALSE(r.u8(a));
  CHECK_FALSE(r.u32(b));
  CHECK_FALSE(r.u64(c));
  CHECK_FALSE(r.i64(d));
  CHECK_FALSE(r.peek_u64(c));
  CHECK(r.bytes(s, 100) == WireReader::BytesStatus::kShort);
  CHECK(r.position() == buf.size());

  // Short reads leave the position where it was.
  const std::string partial = from_hex("0500000000000000 6162");  // declares 5 bytes, has 2
  WireReader p(span_of(partial));
  CHECK(p.bytes(s, 100) == WireReader::BytesStatus::kShort);
  CHECK(p.position() == 0);
  const std::string three = from_hex("010203");
  WireReader q(span_of(three));
  CHECK_FALSE(q.u32(b));
  CHECK(q.position() == 0);
  REQUIRE(q.u8(a));
  CHECK_FALSE(q.u64(c));
  CHECK(q.position() == 1);
}

}  // namespace
}  // namespace ddprun::rdzv
