// Unit tests of agent/state/state_directory.h: the agent's directory of training state (files only).
#include "agent/state/state_directory.h"

#include <fstream>

#include "catch_compat.h"
#include "temp_dir.h"

using ddprun::agent::StateDirectory;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& file, const std::string& text) {
  std::ofstream(file) << text;
}

}  // namespace

TEST_CASE("StateDirectory: fresh, versions by rank and step, temporaries and pruning", "[state]") {
  ddprun::testing::TempDir tmp;
  const fs::path dir = tmp.path / "ddprun-state-42";
  fs::create_directories(dir / "own");
  write(dir / "own" / "rank0.step1.ddps", "a dead agent's");
  StateDirectory state(dir);
  CHECK(StateDirectory::versions(state.own()).empty());  // what a dead agent with this pid left is gone
  CHECK((fs::status(dir).permissions() & fs::perms::all) == fs::perms::owner_all);
  CHECK(fs::is_directory(state.replica()));

  write(state.own() / "rank1.step20.ddps", "22");
  write(state.own() / "rank1.step3.ddps", "1");
  write(state.own() / "rank0.step10.ddps", "4444");
  write(state.own() / ".rank0.step30.77.tmp", "half");
  write(state.own() / "notes.txt", "not a version");
  const auto v = StateDirectory::versions(state.own());
  REQUIRE(v.size() == 3);
  CHECK(v[0].name == ddprun::VersionName{0, 10});
  CHECK(v[0].bytes == 4);
  CHECK(v[1].name == ddprun::VersionName{1, 3});
  CHECK(v[2].name == ddprun::VersionName{1, 20});
  CHECK(StateDirectory::newest(state.own(), 1)->name.step == 20);
  CHECK_FALSE(StateDirectory::newest(state.own(), 2).has_value());
  CHECK(state.bytes_held() == 2 + 1 + 4 + 4 + 13);

  CHECK(StateDirectory::remove_temporaries(state.own()) == std::vector<std::string>{".rank0.step30.77.tmp"});
  CHECK(StateDirectory::remove_temporaries(state.own()).empty());

  StateDirectory::prune(state.own(), 1, 1);
  CHECK_FALSE(fs::exists(state.own() / "rank1.step3.ddps"));
  CHECK(fs::exists(state.own() / "rank1.step20.ddps"));
  CHECK(fs::exists(state.own() / "rank0.step10.ddps"));  // another rank's: untouched

  state.remove();
  CHECK_FALSE(fs::exists(dir));
  state.remove();  // idempotent
}
