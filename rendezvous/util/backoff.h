// A short random pause before retrying after losing a race (a compare-and-swap that another writer won), so
// that racing processes do not collide again in step. Blocks the calling thread for 1-20 ms; thread-safe (a
// generator per thread); never throws.
#pragma once

#include <chrono>
#include <random>
#include <thread>

namespace ddprun {

inline void retry_backoff(std::chrono::milliseconds lo = std::chrono::milliseconds(1),
                          std::chrono::milliseconds hi = std::chrono::milliseconds(20)) {
  thread_local std::minstd_rand rng{std::random_device{}()};
  const auto pause = std::uniform_int_distribution<long long>(lo.count(), hi.count())(rng);
  std::this_thread::sleep_for(std::chrono::milliseconds(pause));
}

}  // namespace ddprun
