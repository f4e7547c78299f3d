// RateLimiter: --state_bandwidth, the cap on the copies of the training state to the buddy node
// (agent/state/replicator.h). A token bucket that lends one chunk ahead: reserve(n, now) says when the n
// bytes may go, so that the bytes sent from any moment on never run ahead of the rate by more than one burst.
//
// Pure (the time is given); not thread-safe (one sender).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace ddprun::agent {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  // bytes_per_second 0: no cap (reserve() returns `now`). burst: bytes that may go at once after an idle
  // time.
  RateLimiter(uint64_t bytes_per_second, uint64_t burst) : rate_(bytes_per_second), burst_(burst) {}

  // When `n` bytes may be sent (at or after `now`); counts them as sent then (GCRA: the theoretical arrival
  // time moves on by n / rate; the bytes may go up to one burst's time before it).
  Clock::time_point reserve(uint64_t n, Clock::time_point now) {
    if (rate_ == 0) return now;
    const Clock::time_point tat = std::max(tat_, now);
    const Clock::time_point at = std::max(now, tat - duration(burst_));
    tat_ = tat + duration(n);
    return at;
  }

 private:
  Clock::duration duration(uint64_t bytes) const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(bytes) / static_cast<double>(rate_)));
  }

  uint64_t rate_;
  uint64_t burst_;
  Clock::time_point tat_{};  // when the bytes reserved so far are paid for
};

}  // namespace ddprun::agent
