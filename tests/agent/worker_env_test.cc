// Unit tests of agent/worker_env: global rank assignment and the environment contract between the agent and
// its workers (torchrun's variables), computed from the agent's environment without touching the process.
#include "agent/worker_env.h"

#include <stdlib.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_compat.h"

using namespace ddprun::agent;

namespace {

WorkerIdentity second_worker_of_node_1() {
  WorkerIdentity who;
  who.local_rank = 1;
  who.rank = 5;
  who.local_world_size = 2;
  who.world_size = 8;
  who.group_rank = 1;
  who.group_world_size = 3;
  who.role = "trainer";
  return who;
}

RoundEnv round_2() {
  RoundEnv r;
  r.master_addr = "10.0.0.1";
  r.master_port = 29400;
  r.restart_count = 2;
  r.max_restarts = 3;
  r.run_id = "job-42";
  r.error_file = "/logs/attempt_2/1/error.json";
  return r;
}

}  // namespace

TEST_CASE("worker_env sets torchrun's contract on top of the agent's environment", "[worker_env]") {
  const Env base{{"PATH", "/usr/bin"}, {"RANK", "99"}, {"MASTER_PORT", "1"}, {"HOME", "/home/u"}};
  Env env = worker_env(base, second_worker_of_node_1(), round_2(), false);
  const Env expected_contract{
      {"LOCAL_RANK", "1"},
      {"RANK", "5"},
      {"GROUP_RANK", "1"},
      {"ROLE_RANK", "5"},
      {"ROLE_NAME", "trainer"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"WORLD_SIZE", "8"},
      {"GROUP_WORLD_SIZE", "3"},
      {"ROLE_WORLD_SIZE", "8"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29400"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"},
      {"TORCHELASTIC_RUN_ID", "job-42"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCHELASTIC_ERROR_FILE", "/logs/attempt_2/1/error.json"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},  // torch >= 2.2's name only, as torchrun 2.x sets it
  };
  for (const auto& [name, value] : expected_contract) {
    INFO(name);
    REQUIRE(env.count(name));
    CHECK(env.at(name) == value);
  }
  CHECK(env.at("PATH") == "/usr/bin");  // inherited
  CHECK(env.at("HOME") == "/home/u");
  CHECK(env.size() == expected_contract.size() + 2);  // nothing else: no OMP_NUM_THREADS unless asked
  CHECK_FALSE(env.count("OMP_NUM_THREADS"));
}

TEST_CASE("worker_env: the user's own settings of the optional variables win", "[worker_env]") {
  RoundEnv round = round_2();
  SECTION("OMP_NUM_THREADS=1 only when the caller asks and the user did not set it") {
    CHECK(worker_env({}, second_worker_of_node_1(), round, true).at("OMP_NUM_THREADS") == "1");
    CHECK(worker_env({{"OMP_NUM_THREADS", "8"}}, second_worker_of_node_1(), round, true)
              .at("OMP_NUM_THREADS") == "8");
  }
  SECTION("NCCL error handling defaults to 1 but keeps the user's value") {
    Env env = worker_env({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}, {"NCCL_ASYNC_ERROR_HANDLING", "3"}},
                         second_worker_of_node_1(), round, false);
    CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0");
    CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "3");
  }
  SECTION("torch before 2.2 reads NCCL_ASYNC_ERROR_HANDLING, as torchrun 1.13 sets it") {
    round.nccl_async_error_handling_var = "NCCL_ASYNC_ERROR_HANDLING";
    Env env = worker_env({}, second_worker_of_node_1(), round, false);
    CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "1");
    CHECK_FALSE(env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING"));
  }
  SECTION("no error file: TORCHELASTIC_ERROR_FILE is not set") {
    round.error_file.clear();
    CHECK_FALSE(worker_env({}, second_worker_of_node_1(), round, false).count("TORCHELASTIC_ERROR_FILE"));
  }
  SECTION("without the agent store") {
    round.use_agent_store = false;
    CHECK(worker_env({}, second_worker_of_node_1(), round, false).at("TORCHELASTIC_USE_AGENT_STORE") ==
          "False");
  }
}

TEST_CASE("current_environment reads the process environment, values with '=' included", "[worker_env]") {
  REQUIRE(::setenv("DDPRUN_WORKER_ENV_TEST", "a=b=c", 1) == 0);
  REQUIRE(::setenv("DDPRUN_WORKER_ENV_EMPTY", "", 1) == 0);
  Env env = current_environment();
  ::unsetenv("DDPRUN_WORKER_ENV_TEST");
  ::unsetenv("DDPRUN_WORKER_ENV_EMPTY");
  CHECK(env.at("DDPRUN_WORKER_ENV_TEST") == "a=b=c");
  CHECK(env.at("DDPRUN_WORKER_ENV_EMPTY").empty());
  CHECK_FALSE(current_environment().count("DDPRUN_WORKER_ENV_TEST"));
}

TEST_CASE("virtual_device: torch's --virtual-local-rank device of a local rank", "[worker_env]") {
  CHECK(virtual_device({}, 3) == "3");  // CUDA_VISIBLE_DEVICES unset: the local rank itself
  CHECK(virtual_device({{"CUDA_VISIBLE_DEVICES", "4,GPU-abc, 7 "}}, 1) == "GPU-abc");
  CHECK(virtual_device({{"CUDA_VISIBLE_DEVICES", "4,GPU-abc, 7 "}}, 2) ==
        "7");                                                         // trimmed, as Python's strip()
  CHECK_FALSE(virtual_device({{"CUDA_VISIBLE_DEVICES", "4,5"}}, 2));  // torch: ValueError
  CHECK(virtual_device({{"CUDA_VISIBLE_DEVICES", ""}}, 0) == "");     // "".split(",") == [""]
  CHECK_FALSE(virtual_device({{"CUDA_VISIBLE_DEVICES", ""}}, 1));

  Env env{{"LOCAL_RANK", "1"}, {"CUDA_VISIBLE_DEVICES", "4,5"}};
  apply_virtual_local_rank({{"CUDA_VISIBLE_DEVICES", "4,5"}}, 1, env);
  CHECK(env.at("LOCAL_RANK") == "0");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "5");
}
