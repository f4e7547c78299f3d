// Unit tests of rendezvous/util/text_util.h: sizes (the memory-budget flags), integers.
#include "rendezvous/util/text_util.h"

#include <cstdint>

#include "catch_compat.h"

TEST_CASE("parse_byte_size: a whole number with an optional binary unit", "[text]") {
  using ddprun::parse_byte_size;
  CHECK(parse_byte_size("0") == uint64_t{0});
  CHECK(parse_byte_size("65536") == uint64_t{65536});
  CHECK(parse_byte_size("64K") == uint64_t{64} << 10);
  CHECK(parse_byte_size("64kib") == uint64_t{64} << 10);
  CHECK(parse_byte_size("256M") == uint64_t{256} << 20);
  CHECK(parse_byte_size("256MiB") == uint64_t{256} << 20);
  CHECK(parse_byte_size("1g") == uint64_t{1} << 30);
  CHECK(parse_byte_size("17179869183G") == uint64_t{17179869183} << 30);  // the largest that fits 64 bits
  for (const char* bad : {"", "M", "1.5G", "-1", "+1", " 1M", "1M ", "1 M", "1T", "1MB", "1Mi", "0x10",
                          "17179869184G", "99999999999999999999"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_byte_size(bad).has_value());
  }
}

TEST_CASE("parse_uint: digits only, 64 bits", "[text]") {
  using ddprun::parse_uint;
  CHECK(parse_uint("0") == uint64_t{0});
  CHECK(parse_uint("65535") == uint64_t{65535});
  CHECK(parse_uint("18446744073709551615") == UINT64_MAX);
  for (const char* bad : {"", "+1", "-1", " 1", "1 ", "1x", "0x10", "18446744073709551616"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_uint(bad).has_value());
  }
}

TEST_CASE("parse_int and parse_int_in: a signed decimal, within a range", "[text]") {
  using ddprun::parse_int;
  using ddprun::parse_int_in;
  CHECK(parse_int("-12") == -12LL);
  CHECK(parse_int("+3") == 3LL);
  for (const char* bad : {"", "+", "-", "++1", "1.0", " 1", "99999999999999999999"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_int(bad).has_value());
  }
  CHECK(parse_int_in<int>("7", 0, 7) == 7);
  CHECK_FALSE(parse_int_in<int>("8", 0, 7).has_value());
  CHECK_FALSE(parse_int_in<int>("-1", 0, 7).has_value());
}
