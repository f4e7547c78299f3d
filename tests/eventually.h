// Test support: eventually(), a bounded poll for state that has no event to await (server statistics, store
// counters). Header-only; for any test.
#pragma once

#include <chrono>
#include <thread>

namespace ddprun::testing {

// Polls `pred` every millisecond until it holds (true) or `limit` passes (false).
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace ddprun::testing
