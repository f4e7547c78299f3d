// The version line of ddprun's programs (`ddprun --version`, `ddprun-store --version`): the project's version
// (CMakeLists.txt) and the commit the binary was built from (cmake/BuildCommit.cmake), so that a binary found
// in a wheel, a .deb, a tarball or an image names its source. Pure; no I/O.
#pragma once

#include <string>
#include <string_view>

namespace ddprun::launcher {

// "<program> <version> (commit <40 hex digits>)", e.g. "ddprun 0.1.0 (commit 25e8a3c...)"; the commit may end
// in " with local changes" or be "unknown" (built outside a git checkout without $DDPRUN_BUILD_COMMIT). No
// newline.
std::string version_text(std::string_view program);

}  // namespace ddprun::launcher
