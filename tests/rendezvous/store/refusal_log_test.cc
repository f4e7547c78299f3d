// RefusalLog: once a minute per source (an IPv4 address, an IPv6 /64), a bounded number of lines a minute,
// the unlogged ones counted, and bounded memory however many addresses are refused.
#include "rendezvous/store/refusal_log.h"

#include <string>

#include "catch_compat.h"

namespace ddprun::rdzv {
namespace {

using Clock = RefusalLog::Clock;
using namespace std::chrono_literals;

TEST_CASE("refusal log: a source is an IPv4 address or an IPv6 /64", "[refusal_log]") {
  CHECK(source_of("10.0.0.7") == "10.0.0.7");
  CHECK(source_of("2001:db8:1:2:3:4:5:6") == "2001:db8:1:2::/64");
  CHECK(source_of("2001:db8:1:2::99") == "2001:db8:1:2::/64");
  CHECK(source_of("::1") == "::/64");
  CHECK(source_of("not an address") == "not an address");
}

TEST_CASE("refusal log: once a minute per source, the lines left out counted", "[refusal_log]") {
  RefusalLog log;
  const auto t0 = Clock::now();
  uint64_t unlogged = 99;
  CHECK(log.should_log("10.0.0.7", t0, unlogged));
  CHECK(unlogged == 0);
  CHECK_FALSE(log.should_log("10.0.0.7", t0 + 10s, unlogged));
  CHECK_FALSE(log.should_log("10.0.0.7", t0 + 59s, unlogged));
  // Another address of the same IPv6 /64 is the same source.
  CHECK(log.should_log("2001:db8::1", t0, unlogged));
  CHECK(unlogged == 2);  // the two refusals since the last line
  CHECK_FALSE(log.should_log("2001:db8::2", t0 + 1s, unlogged));
  CHECK(log.should_log("10.0.0.7", t0 + 60s, unlogged));
  CHECK(unlogged == 1);
}

TEST_CASE("refusal log: lines a minute and sources held are bounded", "[refusal_log]") {
  RefusalLog log(/*max_sources=*/64, /*lines_per_minute=*/10);
  const auto t0 = Clock::now();
  uint64_t unlogged = 0;
  int lines = 0;
  for (int i = 0; i < 100000; ++i) {  // a scan from 100,000 addresses within one second
    const std::string address = "10." + std::to_string(i / 65536) + "." + std::to_string(i / 256 % 256) +
                                "." + std::to_string(i % 256);
    lines += log.should_log(address, t0 + std::chrono::microseconds(i * 10), unlogged);
    CHECK(log.sources() <= 64);
  }
  CHECK(lines == 10);
  CHECK(log.should_log("192.168.0.1", t0 + 61s, unlogged));  // a minute later: lines again
  CHECK(unlogged == 100000 - 10);
}

}  // namespace
}  // namespace ddprun::rdzv
