// error_text(f): what the callable `f` threw (std::exception::what()), or "(no exception)" — for the etcd
// tests that check an error's message. Header-only.
#pragma once

#include <exception>
#include <string>

namespace ddprun::testing {

template <typename F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace ddprun::testing
