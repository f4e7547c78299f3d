// Catch2 for the test sources, whichever major version the build found: v2 (Debian 12, the single header
// <catch2/catch.hpp>) or v3 (Debian 13, split headers). Test sources include this instead of a Catch2 header.
// tests/CMakeLists.txt finds Catch2 3, else 2, and defines DDPRUN_CATCH2_MAJOR for every test target.
//
// The sources use v2's spellings; under v3 the two string matchers they use keep those names:
// Catch::Contains (v3: Catch::Matchers::ContainsSubstring) and Catch::StartsWith (v3: Matchers::StartsWith).
// Write Catch::Contains, never Catch::Matchers::Contains: under v3 that is the range matcher.
// GENERATE's helpers (values, table, from_range, as) are found by the macro itself in both versions.
#pragma once

#if !defined(DDPRUN_CATCH2_MAJOR)
#error "DDPRUN_CATCH2_MAJOR is not defined: link the test target to ddprun_catch_main (tests/CMakeLists.txt)"
#elif DDPRUN_CATCH2_MAJOR >= 3
#include <catch2/catch_all.hpp>
#include <string>

namespace Catch {
inline Matchers::StringContainsMatcher Contains(const std::string& s, CaseSensitive cs = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(s, cs);
}
using Matchers::StartsWith;
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
