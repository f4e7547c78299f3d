// Test support for ddprun::sdk::state (state_test.cc, worker_sdk_torch/torch_state_test.cc): a fresh
// $DDPRUN_STATE_DIR for one test, run as one process alone (RANK, WORLD_SIZE, the attempt and the local world
// size unset), with the quota given; waits for the async save in progress and removes it all at the end.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ddprun/state.h"

namespace ddprun::sdk::testing {

struct StateDir {
  std::filesystem::path dir;
  explicit StateDir(uint64_t quota = 0) {
    static int serial = 0;
    dir = std::filesystem::temp_directory_path() /
          ("ddprun-sdk-state-" + std::to_string(::getpid()) + "-" + std::to_string(serial++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    ::setenv("DDPRUN_STATE_DIR", dir.c_str(), 1);
    ::setenv("DDPRUN_STATE_QUOTA", std::to_string(quota).c_str(), 1);
    for (const char* v : {"RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "LOCAL_WORLD_SIZE"})
      ::unsetenv(v);
  }
  ~StateDir() {
    state::wait();
    ::unsetenv("DDPRUN_STATE_DIR");
    ::unsetenv("DDPRUN_STATE_QUOTA");
    std::filesystem::remove_all(dir);
  }
  StateDir(const StateDir&) = delete;
  StateDir& operator=(const StateDir&) = delete;
  // The directory's file names, sorted.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace ddprun::sdk::testing
