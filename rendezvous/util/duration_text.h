// Durations as ddprun's messages print them, one style everywhere (flags, timeouts, waits, elapsed times):
//   below a second     "300 ms", "0 ms"
//   whole seconds      "5 s", "1800 s"
//   otherwise          "1.5 s", "2.25 s", "26.301 s" (milliseconds, trailing zeros dropped)
// Negative durations get a leading '-'. Pure, thread-safe; nothing throws except std::bad_alloc.
#pragma once

#include <chrono>
#include <string>

namespace ddprun {

std::string duration_text(std::chrono::milliseconds d);

// The same for a duration of another resolution, rounded to the nearest millisecond.
template <class Rep, class Period>
std::string duration_text(std::chrono::duration<Rep, Period> d) {
  return duration_text(std::chrono::round<std::chrono::milliseconds>(d));
}

}  // namespace ddprun
