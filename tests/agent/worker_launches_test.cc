// Unit tests of agent/worker_launches: what the agent spawns for one round (argv, environment, log files,
// console routing) from its configuration and the rendezvous result. Pure: no file or process is touched.
#include "agent/worker_launches.h"

#include <csignal>
#include <string>
#include <vector>

#include "catch_compat.h"

using namespace ddprun::agent;

namespace {

// Two local workers on node 1 of 3 in round 2 (the third attempt), ranks 4 and 5 of 9.
AgentConfig two_workers() {
  AgentConfig c;
  c.role = "trainer";
  c.workers.resize(2);
  for (auto& w : c.workers) w.argv = {"python3", "train.py", "--lr", "0.1"};
  c.workers[0].output.stdout_to_file = true;
  c.workers[0].output.stdout_to_console = false;
  c.workers[0].output.prefix_stderr = true;
  c.workers[1].output.stderr_to_file = true;
  c.workers[1].output.stderr_to_console = false;
  c.base_env = {{"HOME", "/home/u"}};
  c.set_omp_threads = true;
  c.supervision.max_restarts = 3;
  return c;
}

ddprun::rdzv::RendezvousInfo node_1_round_2() {
  ddprun::rdzv::RendezvousInfo info;
  info.round = 2;
  info.group_rank = 1;
  info.group_world_size = 3;
  info.base_rank = 4;
  info.world_size = 9;
  info.store_host = "10.0.0.1";
  info.store_port = 29400;
  return info;
}

std::vector<WorkerLogPaths> paths(int n) {
  std::vector<WorkerLogPaths> out;
  for (int lr = 0; lr < n; ++lr) out.push_back(LogLayout("/logs/job_x").worker(2, lr));
  return out;
}

}  // namespace

TEST_CASE("worker_launches: one launch per local rank with its ranks and the round's environment",
          "[worker_launches]") {
  const auto p = paths(2);
  auto ws = worker_launches(two_workers(), node_1_round_2(), p, "job-42");
  REQUIRE(ws.size() == 2);
  for (int lr = 0; lr < 2; ++lr) {
    const WorkerLaunch& w = ws[static_cast<size_t>(lr)];
    INFO("local rank " << lr);
    CHECK(w.local_rank == lr);
    CHECK(w.argv == std::vector<std::string>{"python3", "train.py", "--lr", "0.1"});
    CHECK(w.env.at("LOCAL_RANK") == std::to_string(lr));
    CHECK(w.env.at("RANK") == std::to_string(4 + lr));
    CHECK(w.env.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(w.env.at("WORLD_SIZE") == "9");
    CHECK(w.env.at("GROUP_RANK") == "1");
    CHECK(w.env.at("GROUP_WORLD_SIZE") == "3");
    CHECK(w.env.at("ROLE_NAME") == "trainer");
    CHECK(w.env.at("MASTER_ADDR") == "10.0.0.1");
    CHECK(w.env.at("MASTER_PORT") == "29400");
    CHECK(w.env.at("TORCHELASTIC_RESTART_COUNT") == "2");  // the round: every round is a new attempt
    CHECK(w.env.at("TORCHELASTIC_MAX_RESTARTS") == "3");
    CHECK(w.env.at("TORCHELASTIC_RUN_ID") == "job-42");
    CHECK(w.env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
    CHECK(w.env.at("TORCHELASTIC_ERROR_FILE") == p[static_cast<size_t>(lr)].error_file.string());
    CHECK(w.env.at("OMP_NUM_THREADS") == "1");
    CHECK(w.env.at("HOME") == "/home/u");
    CHECK(w.whole_lines);  // two workers share the console
  }
  // Rank 0: stdout to its file only, stderr tee'd: its console lines prefixed as torch's TailLog does.
  CHECK(ws[0].stdout_file == p[0].stdout_file);
  CHECK(ws[0].stderr_file.empty());  // torchrun's files only: no stderr.log unless -r/-t ask for it
  CHECK_FALSE(ws[0].console_stdout);
  CHECK(ws[0].console_stderr);
  CHECK(ws[0].stderr_prefix == "[trainer0]:");
  CHECK(ws[0].stdout_prefix.empty());
  // Rank 1: stdout to the console only, no prefix, stderr only to its file.
  CHECK(ws[1].stdout_file.empty());
  CHECK(ws[1].stderr_file == p[1].stderr_file);
  CHECK(ws[1].console_stdout);
  CHECK_FALSE(ws[1].console_stderr);
  CHECK(ws[1].stdout_prefix.empty());
  CHECK(ws[1].stderr_prefix.empty());
}

TEST_CASE("worker_launches: a single worker", "[worker_launches]") {
  AgentConfig c;
  c.workers = {{.argv = {"/bin/true"}}};
  c.workers[0].output.prefix_stdout = true;
  ddprun::rdzv::RendezvousInfo info;  // round 0 of a one-node job
  info.store_host = "127.0.0.1";
  info.store_port = 1234;
  auto ws = worker_launches(c, info, paths(1), "none");
  REQUIRE(ws.size() == 1);
  CHECK(ws[0].stdout_prefix == "[default0]:");
  CHECK_FALSE(ws[0].whole_lines);  // alone on the console: lines pass through as they come
  CHECK(ws[0].env.at("TORCHELASTIC_RESTART_COUNT") == "0");
  CHECK(ws[0].env.at("WORLD_SIZE") == "1");
  CHECK(ws[0].env.at("RANK") == "0");
  CHECK_FALSE(ws[0].env.count("OMP_NUM_THREADS"));  // set_omp_threads is the caller's choice
}

TEST_CASE("worker_launches: hang detection and torch's FileTimer add their variables", "[worker_launches]") {
  AgentConfig c = two_workers();
  auto env_of = [&](const AgentConfig& config) {
    return worker_launches(config, node_1_round_2(), paths(2), "job").at(1).env;
  };
  Env plain = env_of(c);
  // The heartbeat file always: `ddprun status` and the straggler report read it.
  CHECK(plain.at("DDPRUN_PROGRESS_FILE") == "/logs/job_x/attempt_2/1/progress");
  for (const char* name :
       {"DDPRUN_STACK_SIGNAL", "PYTHONPATH", "TORCHELASTIC_TIMER_FILE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}) {
    CHECK_FALSE(plain.count(name));
  }

  c.supervision.hang_timeout = std::chrono::seconds(30);
  c.base_env["PYTHONPATH"] = "/site";
  c.base_env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "50";  // the user's wins
  Env hang = env_of(c);
  // Stack dumps and progress are read from stderr.log: written with hang detection even without -r/-t.
  CHECK(worker_launches(c, node_1_round_2(), paths(2), "job").at(0).stderr_file == paths(2)[0].stderr_file);
  CHECK(hang.at("DDPRUN_PROGRESS_FILE") == "/logs/job_x/attempt_2/1/progress");
  CHECK(hang.at("PYTHONPATH") == "/logs/job_x/python_hooks:/site");
  CHECK(hang.at("DDPRUN_STACK_SIGNAL") == std::to_string(SIGRTMIN + 3));
  CHECK(hang.at("TORCH_NCCL_TRACE_BUFFER_SIZE") == "50");
  CHECK_FALSE(hang.count("TORCH_FR_BUFFER_SIZE"));  // torch >= 2.8 would take it over the user's
  CHECK(hang.at("TORCH_NCCL_DUMP_ON_TIMEOUT") == "1");
  for (const char* name : {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"})
    CHECK(hang.at(name) == "/logs/job_x/attempt_2/1/nccl_trace_rank_");
  for (const char* name : {"TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"})
    CHECK(hang.at(name) == "/logs/job_x/attempt_2/1/nccl_trace_pipe_rank_");
  CHECK_FALSE(hang.count("TORCHELASTIC_TIMER_FILE"));

  c.supervision.hang_timeout = std::chrono::seconds(0);
  c.base_env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
  Env timer = env_of(c);
  CHECK(timer.at("TORCHELASTIC_TIMER_FILE") == "/logs/job_x/timer_fifo");
  CHECK(timer.at("PYTHONPATH") == "/logs/job_x/python_hooks:/site");  // stacks on a missed deadline
  c.base_env["TORCHELASTIC_TIMER_FILE"] = "/run/my_timer";
  CHECK(env_of(c).at("TORCHELASTIC_TIMER_FILE") == "/run/my_timer");
}

TEST_CASE("worker_launches: --virtual-local-rank and --numa-binding shape each launch", "[worker_launches]") {
  AgentConfig c = two_workers();
  const auto p = paths(2);
  SECTION("by default LOCAL_RANK is the local rank, CUDA_VISIBLE_DEVICES inherited, no CPU binding") {
    c.base_env["CUDA_VISIBLE_DEVICES"] = "2,3";
    auto ws = worker_launches(c, node_1_round_2(), p, "job-42");
    CHECK(ws[1].env.at("LOCAL_RANK") == "1");
    CHECK(ws[1].env.at("CUDA_VISIBLE_DEVICES") == "2,3");
    CHECK(ws[1].cpu_affinity.empty());
  }
  SECTION("virtual local rank: LOCAL_RANK=0, each worker its own entry of CUDA_VISIBLE_DEVICES") {
    c.virtual_local_rank = true;
    c.base_env["CUDA_VISIBLE_DEVICES"] = "2, 3";
    auto ws = worker_launches(c, node_1_round_2(), p, "job-42");
    CHECK(ws[0].env.at("LOCAL_RANK") == "0");
    CHECK(ws[1].env.at("LOCAL_RANK") == "0");
    CHECK(ws[0].env.at("CUDA_VISIBLE_DEVICES") == "2");
    CHECK(ws[1].env.at("CUDA_VISIBLE_DEVICES") == "3");
    CHECK(ws[1].env.at("RANK") == "5");  // the global ranks stay
  }
  SECTION("the CPUs of each worker travel to its launch") {
    c.workers[0].cpu_affinity = {0, 1};
    c.workers[1].cpu_affinity = {2, 3};
    auto ws = worker_launches(c, node_1_round_2(), p, "job-42");
    CHECK(ws[0].cpu_affinity == std::vector<int>{0, 1});
    CHECK(ws[1].cpu_affinity == std::vector<int>{2, 3});
  }
}

TEST_CASE("worker_launches: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE names the tee'd lines",
          "[worker_launches]") {
  AgentConfig c = two_workers();
  c.workers[1].output.prefix_stdout = true;
  c.log_line_prefix_template = "[${role_name}-r${rank}-l$local_rank $$ ${other}]";
  c.duplicate_stdout_filters = {"x"};
  c.workers[1].output.stdout_to_file = true;
  auto ws = worker_launches(c, node_1_round_2(), paths(2), "job-42");
  // torch's Template.safe_substitute with role_name, the global rank and the local rank.
  CHECK(ws[0].stderr_prefix == "[trainer-r4-l0 $ ${other}]");
  CHECK(ws[1].stdout_prefix == "[trainer-r5-l1 $ ${other}]");
  CHECK(ws[1].stdout_duplicate.prefix == ws[1].stdout_prefix);  // torch's filtered tail uses the same header
  CHECK(console_prefix(c, 3, 7) == "[trainer-r7-l3 $ ${other}]");
  c.log_line_prefix_template.clear();
  CHECK(console_prefix(c, 3, 7) == "[trainer3]:");
}
