// The TCPStore request parser fed as a socket feeds it: a byte at a time, requests back to back, large
// requests in pieces; dialect detection from the first bytes; limits enforced from declared sizes.
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/wire_codec.h"
#include "wire_test_util.h"

namespace ddprun::rdzv {
namespace {

using namespace wire_test;  // the shared helpers of wire_test_util.h

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

TEST_CASE("AUTH's value is refused past a few KiB on its length field, whatever the value limit",
          "[wire_codec]") {
  const WireLimits limits;  // the defaults: values of 64 MiB, AUTH values of 4 KiB
  Dialect d = GENERATE(Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern);
  INFO(dialect_name(d));
  const std::string auth_byte(1, static_cast<char>(*op_to_byte(d, Op::kAuth)));
  Request out;
  const std::string proof(limits.max_auth_bytes, 'p');  // a proof at the limit is read
  ParseResult r = parse_forced(d, auth_byte + u32_le(2) + u64_le(proof.size()) + proof, out, limits);
  REQUIRE(r.status == ParseStatus::kDone);
  CHECK(out.values == std::vector<std::string>{proof});
  // One byte more, or a megabyte, is refused with only the length sent: nothing of it is buffered.
  for (uint64_t length : {uint64_t{limits.max_auth_bytes} + 1, uint64_t{1} << 20}) {
    CAPTURE(length);
    r = parse_forced(d, auth_byte + u32_le(1) + u64_le(length), out, limits);
    REQUIRE(r.status == ParseStatus::kError);
    CHECK_THAT(r.error, Contains("AUTH value length " + std::to_string(length)) && Contains("limit of 4096"));
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
}  // namespace
}  // namespace ddprun::rdzv
