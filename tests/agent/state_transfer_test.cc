// Unit tests of the pure parts of the copies between agents (agent/state/): the CRC-32C, the messages of the
// protocol (agent/state/state_wire.h), --state_bandwidth's pacing (rate_limiter.h) and the round documents
// (state_peers.h).
#include <chrono>
#include <string>

#include "agent/state/crc32c.h"
#include "agent/state/rate_limiter.h"
#include "agent/state/state_peers.h"
#include "agent/state/state_wire.h"
#include "catch_compat.h"

using namespace ddprun::agent;
using Kind = StateMessage::Kind;

TEST_CASE("crc32c: the check value, and chunks add up to the whole", "[state]") {
  CHECK(crc32c(0, "123456789", 9) == 0xE3069283u);
  CHECK(crc32c(0, "", 0) == 0u);
  std::string data(100003, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  const uint32_t whole = crc32c(0, data.data(), data.size());
  CHECK(crc32c(crc32c(0, data.data(), 13), data.data() + 13, data.size() - 13) == whole);
  data[5000] ^= 1;
  CHECK(crc32c(0, data.data(), data.size()) != whole);
}

TEST_CASE("state messages: exactly what encode_message writes is read back", "[state]") {
  const StateMessage put{.kind = Kind::kPut, .rank = 7, .step = 1200, .bytes = 4096};
  CHECK(encode_message(put) == "put 7 1200 4096");
  CHECK(encode_message(StateMessage{.kind = Kind::kGet, .rank = 3, .step = kEveryStep}) == "get 3");
  CHECK(encode_message(StateMessage{.kind = Kind::kGet, .rank = 3, .step = 40}) == "get 3 40");
  CHECK(encode_message(StateMessage{.kind = Kind::kDone, .crc = 0xE3069283u}) == "done 3808858755");
  CHECK(encode_message(StateMessage{.kind = Kind::kError, .text = "no room"}) == "error no room");
  std::string why;
  for (const std::string text : {"put 7 1200 4096", "get 3", "get 3 0", "get 3 9223372036854775807",
                                 "version 3 5 0", "done 0", "end", "ok", "error anything at all"}) {
    CAPTURE(text);
    const auto m = decode_message(text, why);
    REQUIRE(m.has_value());
    CHECK(encode_message(*m) == text);
  }
  using namespace std::string_literals;
  for (const std::string& text :
       {"put 7 1200"s, "put 7 1200 4096 1"s, "put -7 1 1"s, "put 07 1 1"s, "put 7  1 1"s, "get"s,
        "get 2147483648"s, "get 1 2 3"s, "get 1 9223372036854775808"s, "get 1 -1"s, "done 4294967296"s,
        "end now"s, "ok "s, "hello"s, ""s, "put 1 9223372036854775808 1"s, "ok\0"s}) {
    CAPTURE(text);
    CHECK_FALSE(decode_message(text, why).has_value());
  }
  const unsigned char header[4] = {0x10, 0x27, 0, 0};
  CHECK(frame_length(header) == 10000);
  CHECK(frame_header(10000) == std::string("\x10\x27\0\0", 4));
}

TEST_CASE("the newest step every rank has somewhere: what a restoring node fetches", "[state]") {
  NodeState a, b;
  a.own = {{0, {10, 20}}, {1, {10, 20}}};
  a.replica = {{2, {10, 20}}};
  b.own = {{2, {20, 30}}, {3, {10, 20}}};
  b.replica = {{0, {20}}};
  CHECK(newest_common_step({a, b}, 4) == 20);
  CHECK(newest_common_step({a, b}, 3) == 20);  // rank 2 has 30 alone
  b.own[3] = {10};                             // rank 3's step 20 never committed
  CHECK(newest_common_step({a, b}, 4) == 10);
  CHECK_FALSE(newest_common_step({a, b}, 5).has_value());  // rank 4: no node holds it
  b.own[3] = {30};
  CHECK_FALSE(newest_common_step({a, b}, 4).has_value());  // nothing in common
  CHECK_FALSE(newest_common_step({}, 1).has_value());
  CHECK_FALSE(newest_common_step({a}, 0).has_value());
}

TEST_CASE("rate limiter: no cap, then a steady rate after one burst", "[state]") {
  using Clock = RateLimiter::Clock;
  const Clock::time_point t0{};
  RateLimiter none(0, 1 << 20);
  CHECK(none.reserve(uint64_t{1} << 30, t0) == t0);

  RateLimiter limiter(1000, 500);         // 1000 bytes/s, a burst of 500
  CHECK(limiter.reserve(500, t0) == t0);  // the burst goes at once
  CHECK(limiter.reserve(500, t0) == t0);  // the next chunk may go one burst ahead of the rate: now too
  const auto third = limiter.reserve(500, t0);
  CHECK(third == t0 + std::chrono::milliseconds(500));  // then it waits: 1000 bytes paid at t0 + 1 s
  const auto later = t0 + std::chrono::seconds(10);
  CHECK(limiter.reserve(100, later) == later);  // idle for long: no debt kept, no unbounded burst either
  CHECK(limiter.reserve(1000, later) == later);
  CHECK(limiter.reserve(1, later) > later);
}

TEST_CASE("round documents: written and read back, strangers' read tolerantly", "[state]") {
  NodeState s;
  s.addr = {"10.0.0.2", 40123};
  s.first_rank = 2;
  s.last_rank = 3;
  s.own = {{2, {10, 20}}, {3, {20}}};
  s.replica = {{0, {20}}};
  const std::string text = node_state_text(s);
  std::string why;
  const auto back = read_node_state(text, why);
  REQUIRE(back.has_value());
  CHECK(back->addr == s.addr);
  CHECK(back->own == s.own);
  CHECK(back->replica == s.replica);
  CHECK(back->newest(0) == 20);
  CHECK(back->newest(2) == 20);
  CHECK_FALSE(back->newest(1).has_value());

  const auto odd = read_node_state(
      R"({"addr": "[::1]:5", "own": {"2": [20, "x", -1, 10], "x": [1], "4": 7}, "replica": [], "ranks": "no"})",
      why);
  REQUIRE(odd.has_value());
  CHECK(odd->addr.host == "::1");
  CHECK(odd->own == std::map<int, std::vector<int64_t>>{{2, {10, 20}}});
  CHECK(odd->replica.empty());
  for (const char* bad : {"", "[]", "{}", R"({"addr": 5})", R"({"addr": "host"})", R"({"addr": "h:0"})"}) {
    CAPTURE(bad);
    CHECK_FALSE(read_node_state(bad, why).has_value());
  }
  CHECK(back->holds(2, 10));
  CHECK_FALSE(back->holds(3, 10));
  CHECK(back->holds(0, 20));
  CHECK(node_state_key("job", 3, 1) == "ddprun/job/r3/state/n1");
  CHECK_FALSE(buddy_of(0, 1).has_value());
  CHECK(buddy_of(0, 3) == 1);
  CHECK(buddy_of(2, 3) == 0);
}
