// 64-bit FNV-1a: a stable, dependency-free hash of a byte string, for names and fingerprints that every
// rank must compute alike (not for anything adversarial).
#pragma once

#include <cstdint>
#include <string_view>

namespace ddprun::sdk {

inline uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace ddprun::sdk
