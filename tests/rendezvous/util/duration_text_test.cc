// Unit tests of rendezvous/util/duration_text.h: the one style every message prints durations in.
#include "rendezvous/util/duration_text.h"

#include "catch_compat.h"

TEST_CASE("duration_text: ms below a second, seconds with up to three decimals above", "[text]") {
  using ddprun::duration_text;
  using std::chrono::milliseconds;
  CHECK(duration_text(milliseconds(0)) == "0 ms");
  CHECK(duration_text(milliseconds(300)) == "300 ms");
  CHECK(duration_text(milliseconds(999)) == "999 ms");
  CHECK(duration_text(milliseconds(1000)) == "1 s");
  CHECK(duration_text(milliseconds(1500)) == "1.5 s");
  CHECK(duration_text(milliseconds(2250)) == "2.25 s");
  CHECK(duration_text(milliseconds(1050)) == "1.05 s");
  CHECK(duration_text(milliseconds(26301)) == "26.301 s");
  CHECK(duration_text(milliseconds(1800000)) == "1800 s");
  CHECK(duration_text(milliseconds(-1500)) == "-1.5 s");
  CHECK(duration_text(std::chrono::seconds(30)) == "30 s");
  CHECK(duration_text(std::chrono::duration<double>(0.0004)) == "0 ms");
  CHECK(duration_text(std::chrono::microseconds(2600)) == "3 ms");  // rounded to the nearest millisecond
}
