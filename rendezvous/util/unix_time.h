// unix_now: the wall clock in seconds since the Unix epoch, as the agents' documents and events carry it
// (status documents, the event log, a failure's time). Monotonic time (steady_clock) is for every deadline.
#pragma once

#include <chrono>

namespace ddprun {

inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace ddprun
