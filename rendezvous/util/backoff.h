// A short random pause before retrying after losing a race (a compare-and-swap that another writer won), so
// that racing processes do not collide again in step. Blocks the calling thread for 1-20 ms; thread-safe (a
// generator per thread); never throws.
#pragma once

#include <chrono>
#include <random>
#include <thread>

namespace ddprun {

inline void retry_backoff() {
  thread_local std::minstd_rand rng{std::random_device{}()};
  std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(1, 20)(rng)));
}

}  // namespace ddprun
