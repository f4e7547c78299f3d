// RefusalLog: which of a store's refusals are logged, in bounded memory and without scanning: once a minute
// per source, and at most `lines_per_minute` lines a minute in all, each line saying how many refusals went
// unlogged before it. A scan from a million addresses costs a few lines and `max_sources` entries.
//
// A source (source_of) is what one host may hold whole: an IPv4 address, an IPv6 address's /64. The store's
// per-address cap on handshakes counts by source too (StoreServerOptions::max_handshakes_per_address).
//
// Pure: the clock is the caller's. Single-threaded (the store's thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>

namespace ddprun::rdzv {

// "10.0.0.7" -> "10.0.0.7"; "2001:db8:1:2:3:4:5:6" -> "2001:db8:1:2::/64"; anything else as given.
std::string source_of(const std::string& address);

class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RefusalLog(size_t max_sources = 1024, size_t lines_per_minute = 60);

  // Whether the refusal of a client at `address` at `now` is logged. When true, `unlogged` is how many
  // refusals were not logged since the last line that was.
  bool should_log(const std::string& address, Clock::time_point now, uint64_t& unlogged);
  size_t sources() const { return last_.size(); }

 private:
  const size_t max_sources_;
  const size_t lines_per_minute_;
  std::unordered_map<std::string, Clock::time_point> last_;      // source -> when it was last logged
  std::deque<std::pair<Clock::time_point, std::string>> order_;  // the same, oldest first
  Clock::time_point window_start_{};
  size_t lines_ = 0;  // logged since window_start_
  uint64_t unlogged_ = 0;
};

}  // namespace ddprun::rdzv
