#include "rendezvous/util/duration_text.h"

namespace ddprun {

std::string duration_text(std::chrono::milliseconds d) {
  long long ms = d.count();
  std::string sign;
  if (ms < 0) {
    sign = "-";
    ms = -ms;
  }
  if (ms < 1000) return sign + std::to_string(ms) + " ms";
  std::string text = sign + std::to_string(ms / 1000);
  if (const long long frac = ms % 1000; frac != 0) {
    std::string digits = std::to_string(1000 + frac).substr(1);  // "050" for 50 ms
    digits.erase(digits.find_last_not_of('0') + 1);
    text += "." + digits;
  }
  return text + " s";
}

}  // namespace ddprun
