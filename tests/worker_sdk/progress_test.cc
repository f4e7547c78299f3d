// Unit test of ddprun/progress.h: heartbeat() writes the step count and the last step time into
// $DDPRUN_PROGRESS_FILE, the line the agent reads (agent/watchdog/progress_monitor.h read_heartbeat).
#include "ddprun/progress.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "catch_compat.h"

TEST_CASE("heartbeat: one fixed-width line, overwritten by each step", "[worker_sdk][progress]") {
  const auto file =
      std::filesystem::temp_directory_path() / ("ddprun-sdk-beat-" + std::to_string(::getpid()));
  REQUIRE(::setenv("DDPRUN_PROGRESS_FILE", file.c_str(), 1) == 0);
  ddprun::sdk::heartbeat();
  ddprun::sdk::heartbeat(12345.5, 1234.5);
  ddprun::sdk::heartbeat(0.25, 0.0625);
  std::ifstream in(file);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // <step> <before the first collective> <step time>; no leftover of the longer line before.
  CHECK(all == "                   3           0.062500           0.250000\n");
  ddprun::sdk::heartbeat();
  std::ifstream again(file);
  std::getline(again, all);
  CHECK(all == "                   4          -1.000000          -1.000000");  // unknown times
  std::filesystem::remove(file);
  ::unsetenv("DDPRUN_PROGRESS_FILE");
}
