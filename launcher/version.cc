#include "launcher/version.h"

#include "ddprun_build_commit.h"  // generated: cmake/BuildCommit.cmake

#ifndef DDPRUN_VERSION
#error "DDPRUN_VERSION is set by launcher/CMakeLists.txt"
#endif

namespace ddprun::launcher {

std::string version_text(std::string_view program) {
  return std::string(program) + " " + DDPRUN_VERSION + " (commit " + DDPRUN_BUILD_COMMIT + ")";
}

}  // namespace ddprun::launcher
