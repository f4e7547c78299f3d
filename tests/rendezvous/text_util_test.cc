// Unit tests of rendezvous/text_util.h's parse_byte_size (the memory-budget flags' sizes).
#include "rendezvous/text_util.h"

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
