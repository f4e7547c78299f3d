// Deadline: the point in time a blocking call of the CPU backend must give up by, and the time it started.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

namespace ddprun::sdk {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds timeout) : start_(Clock::now()), end_(start_ + timeout) {}

  bool expired() const { return Clock::now() >= end_; }
  Clock::time_point end() const { return end_; }
  // Milliseconds left, rounded up (for poll()); 0 when expired.
  int remaining_ms() const {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(end_ - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
  }
  std::chrono::milliseconds remaining() const { return std::chrono::milliseconds(remaining_ms()); }
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // "1.234 s"
  std::string elapsed_text() const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f s", elapsed_s());
    return buf;
  }

 private:
  Clock::time_point start_;
  Clock::time_point end_;
};

}  // namespace ddprun::sdk
