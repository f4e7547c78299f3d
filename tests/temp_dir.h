// Test support: a temporary directory that lives as long as the test's TempDir and is removed with
// everything in it at its end. Header-only; for any test.
//
//   ddprun::testing::TempDir dir;                     // $TMPDIR/ddprun-test-XXXXXX
//   auto file = dir.write("error.json", "{}");         // dir.path / "error.json", written
//
// The constructor fails the current Catch2 test (REQUIRE) when the directory cannot be created; removal
// errors are ignored.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "catch_compat.h"

namespace ddprun::testing {

class TempDir {
 public:
  TempDir() : path(make()) {}
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::filesystem::path operator/(const std::string& name) const { return path / name; }

  // Writes `text` to the file `name` in the directory (replacing it) and returns its path.
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
  // The same, then gives the file `perms`.
  std::filesystem::path write(const std::string& name, const std::string& text,
                              std::filesystem::perms perms) const {
    write(name, text);
    std::filesystem::permissions(path / name, perms);
    return path / name;
  }

  const std::filesystem::path path;

 private:
  static std::filesystem::path make() {
    std::string name = (std::filesystem::temp_directory_path() / "ddprun-test-XXXXXX").string();
    REQUIRE(::mkdtemp(name.data()) != nullptr);
    return name;
  }
};

}  // namespace ddprun::testing
