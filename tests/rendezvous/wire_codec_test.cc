// Byte-level tests of the TCPStore wire codec: command tables, request parsing, dialect detection, limits,
// and the little-endian field layout of WireWriter/WireReader.
#include "rendezvous/wire_codec.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.h"

namespace ddprun::rdzv {
namespace {

using Catch::Contains;  // the string matcher (catch_compat.h)

constexpr Dialect kDialects[] = {Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern};
constexpr int kNumOps = 19;

// "00 0200 2f" -> bytes; spaces are ignored.
std::string from_hex(std::string_view hex) {
  std::string out;
  int nibbles = 0;
  unsigned acc = 0;
  for (char c : hex) {
    if (c == ' ') continue;
    unsigned v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : c - 'A' + 10;
    acc = acc * 16 + v;
    if (++nibbles == 2) {
      out.push_back(static_cast<char>(acc));
      nibbles = 0;
      acc = 0;
    }
  }
  return out;
}

std::span<const uint8_t> span_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string u64_le(uint64_t v) {
  std::string out;
  WireWriter(out).u64(v);
  return out;
}

// A representative request of every op, with every field filled (non-trivial values, odd bytes).
Request sample(Op op) {
  Request r;
  r.op = op;
  switch (op) {
    case Op::kValidate:
      r.number = kValidationMagic;
      break;
    case Op::kPing:
      r.number = 0xA1B2C3D4;
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      r.keys = {"/key"};
      r.values = {std::string("v\0\xff", 3)};
      break;
    case Op::kCompareSet:
      r.keys = {"/cas"};
      r.values = {"old", "new-value"};
      break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      r.keys = {"/get"};
      break;
    case Op::kAdd:
      r.keys = {"init/"};
      r.delta = -5;
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      r.keys = {"/a", "", "/ccc"};
      break;
    case Op::kMultiSet:
      r.keys = {"/a", "/b"};
      r.values = {"1", ""};
      break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      break;
  }
  return r;
}

ParseResult parse_forced(Dialect d, const std::string& bytes, Request& out, WireLimits limits = {}) {
  RequestParser parser(limits, d);
  return parser.parse(span_of(bytes), out);
}

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

// Feeds every proper prefix of `bytes` (each must need more and consume nothing), then the whole.
void feed_bytewise(RequestParser& parser, const std::string& bytes, const Request& expected) {
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("prefix of " << n << " of " << bytes.size() << " bytes");
    Request out;
    ParseResult r = parser.parse(span_of(bytes).first(n), out);
    REQUIRE(r.status == ParseStatus::kNeedMore);
    REQUIRE(r.consumed == 0);
  }
  Request out;
  ParseResult r = parser.parse(span_of(bytes), out);
  REQUIRE(r.status == ParseStatus::kDone);
  CHECK(r.consumed == bytes.size());
  CHECK(out == expected);
}

TEST_CASE("a request fed one byte at a time needs more until its last byte", "[wire_codec]") {
  Dialect d = GENERATE(Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern);
  Op op = static_cast<Op>(GENERATE(range(0, kNumOps)));
  if (!op_to_byte(d, op)) return;
  INFO(dialect_name(d) << " " << op_name(op));
  std::string bytes;
  REQUIRE(encode_request(d, sample(op), bytes));

  SECTION("forced dialect") {
    RequestParser parser(WireLimits{}, d);
    feed_bytewise(parser, bytes, sample(op));
  }
  SECTION("detected dialect") {
    RequestParser parser(WireLimits{});
    if (d == Dialect::kModern && op != Op::kValidate) {
      // A modern connection is recognised by its VALIDATE, which comes first.
      std::string validate;
      REQUIRE(encode_request(d, sample(Op::kValidate), validate));
      Request v;
      REQUIRE(parser.parse(span_of(validate), v).status == ParseStatus::kDone);
    } else if (detect_dialect(span_of(bytes)) != d) {
      // Mid-2023 ops numbered like legacy ones cannot be told apart as a first request.
      CHECK(d == Dialect::kMid2023);
      return;
    }
    feed_bytewise(parser, bytes, sample(op));
    CHECK(parser.dialect() == d);
  }
}

TEST_CASE("two requests back to back parse one at a time", "[wire_codec]") {
  Dialect d = GENERATE(Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern);
  INFO(dialect_name(d));
  const Request first = sample(Op::kSet);
  const Request second = sample(Op::kCompareSet);
  std::string a, b;
  REQUIRE(encode_request(d, first, a));
  REQUIRE(encode_request(d, second, b));
  const std::string both = a + b + b.substr(0, 3);  // and a partial third one
  RequestParser parser(WireLimits{}, d);
  Request out;
  ParseResult r1 = parser.parse(span_of(both), out);
  REQUIRE(r1.status == ParseStatus::kDone);
  CHECK(r1.consumed == a.size());
  CHECK(out == first);
  ParseResult r2 = parser.parse(span_of(both).subspan(r1.consumed), out);
  REQUIRE(r2.status == ParseStatus::kDone);
  CHECK(r2.consumed == b.size());
  CHECK(out == second);
  ParseResult r3 = parser.parse(span_of(both).subspan(r1.consumed + r2.consumed), out);
  CHECK(r3.status == ParseStatus::kNeedMore);
  CHECK(r3.consumed == 0);
}

TEST_CASE("a large MULTI_SET fed in 64-byte pieces resumes after its whole fields and ends as one request",
          "[wire_codec]") {
  Request big{.op = Op::kMultiSet};
  for (int i = 0; i < 2000; ++i) {
    big.keys.push_back("key" + std::to_string(i));
    big.values.push_back(std::string(static_cast<size_t>(i % 97), 'v'));
  }
  std::string bytes;
  REQUIRE(encode_request(Dialect::kModern, big, bytes));
  SECTION("well formed") {
    RequestParser parser(WireLimits{}, Dialect::kModern);
    Request out;
    for (size_t have = 64; have < bytes.size(); have += 64) {
      REQUIRE(parser.parse(span_of(bytes).first(have), out).status == ParseStatus::kNeedMore);
    }
    ParseResult r = parser.parse(span_of(bytes), out);
    REQUIRE(r.status == ParseStatus::kDone);
    CHECK(r.consumed == bytes.size());
    CHECK(out == big);
    // The parser starts afresh for the next request.
    std::string get;
    REQUIRE(encode_request(Dialect::kModern, sample(Op::kGet), get));
    REQUIRE(parser.parse(span_of(get), out).status == ParseStatus::kDone);
    CHECK(out == sample(Op::kGet));
  }
  SECTION("a field over the limit far into the request is still refused") {
    WireLimits limits;
    limits.max_value_bytes = 90;  // value 91 (91 bytes) is the first one over
    RequestParser parser(limits, Dialect::kModern);
    Request out;
    ParseResult r;
    for (size_t have = 64; have <= bytes.size(); have += 64) {
      r = parser.parse(span_of(bytes).first(have), out);
      if (r.status != ParseStatus::kNeedMore) break;
    }
    CHECK(r.status == ParseStatus::kError);
    CHECK(r.error == "value length 91 exceeds the limit of 90 bytes");
  }
}

TEST_CASE("dialect detection from the first bytes", "[wire_codec]") {
  auto detect = [](std::string_view hex) { return detect_dialect(span_of(from_hex(hex))); };
  SECTION("modern: VALIDATE followed by the magic") {
    CHECK(detect("00 cef7853c") == Dialect::kModern);
    CHECK(detect("00 cef7853c 0d01020304") == Dialect::kModern);
  }
  SECTION("legacy: SET whose key length follows the 0") {
    CHECK(detect("00 0200000000000000") == Dialect::kLegacy);
    CHECK(detect("00 02000000") == Dialect::kLegacy);
    CHECK(detect("00 cef7853d") == Dialect::kLegacy);
  }
  SECTION("a leading 0 needs 5 bytes") {
    CHECK_FALSE(detect("").has_value());
    CHECK_FALSE(detect("00").has_value());
    CHECK_FALSE(detect("00 ce").has_value());
    CHECK_FALSE(detect("00 cef785").has_value());
    CHECK_FALSE(detect("00 020000").has_value());
  }
  SECTION("bytes only mid-2023 has") {
    CHECK(detect("09") == Dialect::kMid2023);
    CHECK(detect("0a") == Dialect::kMid2023);
    CHECK(detect("0b") == Dialect::kMid2023);
  }
  SECTION("every other first byte is legacy") {
    for (int b = 1; b < 256; ++b) {
      if (b >= 9 && b <= 11) continue;
      INFO("byte " << b);
      CHECK(detect_dialect(std::vector<uint8_t>{static_cast<uint8_t>(b)}) == Dialect::kLegacy);
    }
  }
  SECTION("the parser detects once and keeps the dialect") {
    RequestParser parser(WireLimits{});
    CHECK_FALSE(parser.dialect().has_value());
    std::string bytes = from_hex("00 cef7");
    Request out;
    CHECK(parser.parse(span_of(bytes), out).status == ParseStatus::kNeedMore);
    CHECK_FALSE(parser.dialect().has_value());
    bytes = from_hex("00 cef7853c 0d 04030201");
    ParseResult r = parser.parse(span_of(bytes), out);
    REQUIRE(r.status == ParseStatus::kDone);
    CHECK(out.op == Op::kValidate);
    CHECK(parser.dialect() == Dialect::kModern);
    r = parser.parse(span_of(bytes).subspan(r.consumed), out);
    REQUIRE(r.status == ParseStatus::kDone);
    CHECK(out.op == Op::kPing);
    CHECK(out.number == 0x01020304);
  }
  SECTION("a mid-2023 first request is detected by the parser") {
    std::string bytes;
    REQUIRE(encode_request(Dialect::kMid2023, sample(Op::kMultiGet), bytes));
    RequestParser parser(WireLimits{});
    Request out;
    REQUIRE(parser.parse(span_of(bytes), out).status == ParseStatus::kDone);
    CHECK(parser.dialect() == Dialect::kMid2023);
    CHECK(out == sample(Op::kMultiGet));
  }
  SECTION("a forced dialect skips detection") {
    // In modern numbering byte 1 is SET; detection would have called the connection legacy (COMPARE_SET).
    std::string bytes;
    REQUIRE(encode_request(Dialect::kModern, sample(Op::kSet), bytes));
    RequestParser parser(WireLimits{}, Dialect::kModern);
    Request out;
    REQUIRE(parser.parse(span_of(bytes), out).status == ParseStatus::kDone);
    CHECK(out == sample(Op::kSet));
    CHECK(parser.dialect() == Dialect::kModern);

    // Forced legacy reads VALIDATE's bytes as a SET with a ~1 GB key length: refused by the limit.
    RequestParser legacy(WireLimits{}, Dialect::kLegacy);
    bytes = from_hex("00 cef7853c 00000000");
    ParseResult r = legacy.parse(span_of(bytes), out);
    CHECK(r.status == ParseStatus::kError);
    CHECK(legacy.dialect() == Dialect::kLegacy);
  }
}

TEST_CASE("limits are enforced from declared sizes, before the payload arrives", "[wire_codec]") {
  WireLimits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 64;
  limits.max_keys_per_request = 4;
  limits.max_request_bytes = 100;
  Dialect d = GENERATE(Dialect::kLegacy, Dialect::kModern);
  INFO(dialect_name(d));
  const std::string set_byte(1, static_cast<char>(*op_to_byte(d, Op::kSet)));
  const std::string check_byte(1, static_cast<char>(*op_to_byte(d, Op::kCheck)));
  const std::string get_byte(1, static_cast<char>(*op_to_byte(d, Op::kGet)));
  Request out;

  auto expect_error = [&](const std::string& bytes, std::initializer_list<std::string> parts) {
    ParseResult r = parse_forced(d, bytes, out, limits);
    REQUIRE(r.status == ParseStatus::kError);
    CHECK(r.consumed == 0);
    for (const auto& p : parts) CHECK_THAT(r.error, Contains(p));
  };

  SECTION("a key at the limit is fine, one byte more is not") {
    std::string ok = get_byte + u64_le(16) + std::string(16, 'k');
    ParseResult r = parse_forced(d, ok, out, limits);
    CHECK(r.status == ParseStatus::kDone);
    expect_error(get_byte + u64_le(17), {"key length 17", "limit of 16 bytes"});
  }
  SECTION("value over max_value_bytes") {
    expect_error(set_byte + u64_le(1) + "k" + u64_le(65), {"value length 65", "limit of 64 bytes"});
  }
  SECTION("u64 lengths of 2^63 and 2^64-1") {
    expect_error(get_byte + u64_le(uint64_t{1} << 63), {"key length 9223372036854775808"});
    expect_error(get_byte + u64_le(std::numeric_limits<uint64_t>::max()),
                 {"key length 18446744073709551615"});
    expect_error(set_byte + u64_le(1) + "k" + u64_le(std::numeric_limits<uint64_t>::max()),
                 {"value length 18446744073709551615"});
    // With the default (large) limits too.
    ParseResult r = parse_forced(d, get_byte + u64_le(std::numeric_limits<uint64_t>::max()), out);
    CHECK(r.status == ParseStatus::kError);
    r = parse_forced(d, get_byte + u64_le(uint64_t{1} << 63), out);
    CHECK(r.status == ParseStatus::kError);
  }
  SECTION("key count over max_keys_per_request") {
    std::string ok = check_byte + u64_le(4);
    for (int i = 0; i < 4; ++i) ok += u64_le(1) + "k";
    CHECK(parse_forced(d, ok, out, limits).status == ParseStatus::kDone);
    expect_error(check_byte + u64_le(5), {"key count 5", "limit of 4"});
    expect_error(check_byte + u64_le(std::numeric_limits<uint64_t>::max()),
                 {"key count 18446744073709551615"});
  }
  SECTION("total request size over max_request_bytes") {
    // SET: 1 + 8 + 16 + 8 + 64 = 97 bytes fits; a WAIT of 4 keys of 16 bytes (1 + 8 + 4 * 24 = 105) does not.
    std::string ok = set_byte + u64_le(16) + std::string(16, 'k') + u64_le(64) + std::string(64, 'v');
    CHECK(parse_forced(d, ok, out, limits).status == ParseStatus::kDone);
    std::string wait(1, static_cast<char>(*op_to_byte(d, Op::kWait)));
    wait += u64_le(4);
    for (int i = 0; i < 3; ++i) wait += u64_le(16) + std::string(16, 'k');
    wait += u64_le(16);  // the fourth key's length, without its bytes
    expect_error(wait, {"request larger than the limit of 100 bytes"});
  }
}

TEST_CASE("MULTI_SET with a negative count is refused", "[wire_codec]") {
  Dialect d = GENERATE(Dialect::kMid2023, Dialect::kModern);
  INFO(dialect_name(d));
  WireLimits limits;
  limits.max_keys_per_request = 4;
  std::string bytes(1, static_cast<char>(*op_to_byte(d, Op::kMultiSet)));
  WireWriter(bytes).i64(-1);
  Request out;
  ParseResult r = parse_forced(d, bytes, out, limits);
  REQUIRE(r.status == ParseStatus::kError);
  CHECK_THAT(r.error, Contains("key count -1"));
  bytes.resize(1);
  WireWriter(bytes).i64(std::numeric_limits<int64_t>::min());
  r = parse_forced(d, bytes, out);  // default limits
  REQUIRE(r.status == ParseStatus::kError);
  CHECK_THAT(r.error, Contains("-9223372036854775808"));
}

TEST_CASE("VALIDATE with a wrong magic is an error", "[wire_codec]") {
  Request out;
  ParseResult r = parse_forced(Dialect::kModern, from_hex("00 cef7853d"), out);
  CHECK(r.status == ParseStatus::kError);
  CHECK_THAT(r.error, Contains("VALIDATE"));
  r = parse_forced(Dialect::kModern, from_hex("00 00000000"), out);
  CHECK(r.status == ParseStatus::kError);
  r = parse_forced(Dialect::kModern, from_hex("00 cef785"), out);
  CHECK(r.status == ParseStatus::kNeedMore);
  r = parse_forced(Dialect::kModern, from_hex("00 cef7853c"), out);
  CHECK(r.status == ParseStatus::kDone);
  CHECK(out.number == kValidationMagic);
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
