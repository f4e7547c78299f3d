// Unit tests of Slurm support: launcher/slurm/slurm_env.h (environment -> derived settings) and its wiring into
// the command line (launcher/launch_config.h, the --dry-run block of launcher/dry_run.h). Pure: no processes.
//
// The environments are the variables a real Slurm 22.05 set (scripts/slurm-cluster.sh, `sbatch -N2`):
// srun_env() is what task 1 of `srun --ntasks-per-node=1` saw, batch_env() what the batch script saw.
#include "launcher/slurm/slurm_env.h"

#include <set>

#include "catch_compat.h"
#include "launcher/dry_run.h"
#include "launcher/launch_config.h"

namespace {

using namespace ddprun::launcher;
using Env = std::map<std::string, std::string>;
using Args = std::vector<std::string>;

Env batch_env() {
  return {{"SLURMD_NODENAME", "n1"},
          {"SLURM_CPUS_ON_NODE", "1"},
          {"SLURM_JOBID", "1"},
          {"SLURM_JOB_CPUS_PER_NODE", "1(x2)"},
          {"SLURM_JOB_ID", "1"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NNODES", "2"},
          {"SLURM_NODEID", "0"},
          {"SLURM_NODELIST", "n[1-2]"},
          {"SLURM_PROCID", "0"},
          {"SLURM_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_TOPOLOGY_ADDR", "n1"}};
}

Env srun_env() {
  Env e = batch_env();
  for (const auto& [k, v] : Env{{"SLURMD_NODENAME", "n2"},
                                {"SLURM_NODEID", "1"},
                                {"SLURM_PROCID", "1"},
                                {"SLURM_GTIDS", "1"},
                                {"SLURM_NPROCS", "2"},
                                {"SLURM_NTASKS", "2"},
                                {"SLURM_NTASKS_PER_NODE", "1"},
                                {"SLURM_STEPID", "0"},
                                {"SLURM_STEP_ID", "0"},
                                {"SLURM_STEP_NODELIST", "n[1-2]"},
                                {"SLURM_STEP_NUM_NODES", "2"},
                                {"SLURM_STEP_NUM_TASKS", "2"},
                                {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                                {"SLURM_TOPOLOGY_ADDR", "n2"}}) {
    e[k] = v;
  }
  return e;
}

Env with(Env e, const Env& changes) {
  for (const auto& [k, v] : changes) {
    if (v.empty()) {
      e.erase(k);
    } else {
      e[k] = v;
    }
  }
  return e;
}

std::string source_of(const SlurmSettings& s, const std::string& setting) {
  for (const auto& d : s.derived) {
    if (d.setting == setting) return d.value + " <- " + d.source;
  }
  return "(none)";
}

std::string derive_error(const Env& env, int nproc = 2) {
  std::string error;
  auto s = derive_slurm(env, nproc, error);
  INFO("derived although an error was expected");
  CHECK_FALSE(s);
  return error;
}

struct Parsed {
  ParseResult result;
  LaunchConfig config;
};

Parsed parse(const Args& args, const Env& env) {
  Args argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  Parsed p;
  p.result = parse_launch_config(
      argv, env, [] { return 0; }, p.config);
  return p;
}

}  // namespace

TEST_CASE("detection needs SLURM_JOB_ID and SLURM_PROCID") {
  CHECK(slurm_detected(srun_env()));
  CHECK(slurm_detected(batch_env()));
  CHECK_FALSE(slurm_detected({}));
  CHECK_FALSE(slurm_detected({{"SLURM_JOB_ID", "7"}}));  // salloc shell: no task
  CHECK_FALSE(slurm_detected({{"SLURM_JOB_ID", "7"}, {"SLURM_PROCID", ""}}));
  CHECK_FALSE(slurm_detected({{"SLURM_PROCID", "0"}}));
}

TEST_CASE("one task per node: nodes, node rank, first host, job id and ports come from the step") {
  std::string error;
  auto s = derive_slurm(srun_env(), 2, error);
  INFO(error);
  REQUIRE(s);
  CHECK(s->nnodes == 2);
  CHECK(s->node_rank == 1);
  CHECK(s->first_host == "n1");
  CHECK(s->job_id == "1");
  CHECK(s->step_token == "1.0");
  CHECK_FALSE(s->task_mode);
  CHECK_FALSE(s->batch_step);
  CHECK(s->ports == slurm_port_candidates(1));
  CHECK(source_of(*s, "--nnodes") == "2 <- SLURM_STEP_NUM_NODES=2");
  CHECK(source_of(*s, "--node_rank") == "1 <- SLURM_NODEID=1");
  CHECK(source_of(*s, "--master_addr") == "n1 <- SLURM_STEP_NODELIST=n[1-2] (first host)");
  CHECK(source_of(*s, "--rdzv_id") == "1 <- SLURM_JOB_ID=1");
  CHECK(source_of(*s, "--master_port") ==
        "20001 <- SLURM_JOB_ID=1 (probed in order: 20001,21010,22019,23028,24037,25046,26055,27064)");
}

TEST_CASE("a step on part of the job's nodes uses the step's variables") {
  // srun -N1 -n1 inside a 2-node job (as recorded): SLURM_NNODES follows the step, SLURM_JOB_NUM_NODES not.
  Env e = with(srun_env(), {{"SLURM_NODEID", "0"},
                            {"SLURM_PROCID", "0"},
                            {"SLURM_STEP_ID", "1"},
                            {"SLURM_NNODES", "1"},
                            {"SLURM_STEP_NUM_NODES", "1"},
                            {"SLURM_STEP_NODELIST", "n1"},
                            {"SLURM_NODELIST", "n1"},
                            {"SLURM_STEP_NUM_TASKS", "1"},
                            {"SLURM_NTASKS", "1"},
                            {"SLURM_STEP_TASKS_PER_NODE", "1"},
                            {"SLURM_TASKS_PER_NODE", "1"}});
  std::string error;
  auto s = derive_slurm(e, 4, error);
  INFO(error);
  REQUIRE(s);
  CHECK(s->nnodes == 1);
  CHECK(s->node_rank == 0);
  CHECK(s->step_token == "1.1");
}

TEST_CASE("without SLURM_STEP_* variables the job-level ones are used") {
  Env e = srun_env();
  for (const char* k : {"SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
                        "SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID"}) {
    e.erase(k);
  }
  e["SLURM_NODELIST"] = "gpu-a100-[07-08]";
  e["SLURM_JOB_NODELIST"] = "gpu-a100-[07-08]";
  std::string error;
  auto s = derive_slurm(e, 8, error);
  INFO(error);
  REQUIRE(s);
  CHECK(s->nnodes == 2);
  CHECK(s->first_host == "gpu-a100-07");
  CHECK(source_of(*s, "--nnodes") == "2 <- SLURM_NNODES=2");
  CHECK(s->step_token == "1.0");  // SLURM_STEPID
}

TEST_CASE("the restart count of a requeued job is part of the step token") {
  std::string error;
  auto s = derive_slurm(with(srun_env(), {{"SLURM_RESTART_COUNT", "2"}}), 2, error);
  REQUIRE(s);
  CHECK(s->step_token == "1.0.r2");
}

TEST_CASE("the batch script: one-node jobs are fine, multi-node jobs are refused") {
  CHECK_THAT(derive_error(batch_env()), Catch::Contains("SLURM_STEP_ID is unset") &&
                                            Catch::Contains("2-node job (SLURM_JOB_NUM_NODES=2)") &&
                                            Catch::Contains("srun --ntasks-per-node=1 ddprun"));
  Env one = with(batch_env(), {{"SLURM_JOB_NUM_NODES", "1"},
                               {"SLURM_NNODES", "1"},
                               {"SLURM_JOB_NODELIST", "n7"},
                               {"SLURM_NODELIST", "n7"}});
  std::string error;
  auto s = derive_slurm(one, 4, error);
  INFO(error);
  REQUIRE(s);
  CHECK(s->batch_step);
  CHECK(s->nnodes == 1);
  CHECK(s->node_rank == 0);
  CHECK(s->first_host == "n7");
  CHECK(s->step_token == "1.batch");
}

TEST_CASE("several tasks per node: refused with several workers each, one agent per task otherwise") {
  Env e = with(srun_env(), {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                            {"SLURM_TASKS_PER_NODE", "2(x2)"},
                            {"SLURM_STEP_NUM_TASKS", "4"},
                            {"SLURM_NTASKS", "4"},
                            {"SLURM_PROCID", "3"}});
  CHECK_THAT(derive_error(e, 2),
             Catch::Contains("several tasks on a node (SLURM_STEP_TASKS_PER_NODE=2(x2))") &&
                 Catch::Contains("--nproc_per_node=2") && Catch::Contains("srun --ntasks-per-node=1"));
  std::string error;
  auto s = derive_slurm(e, 1, error);
  INFO(error);
  REQUIRE(s);
  CHECK(s->task_mode);
  CHECK(s->nnodes == 4);
  CHECK(s->node_rank == 3);
  CHECK(source_of(*s, "--nnodes") == "4 <- SLURM_STEP_NUM_TASKS=4 (one agent per task)");
  CHECK(source_of(*s, "--node_rank") == "3 <- SLURM_PROCID=3");
  // Task 0 must be on the first host, where every other task looks for its store.
  CHECK_THAT(derive_error(with(e, {{"SLURM_PROCID", "0"}, {"SLURM_NODEID", "1"}}), 1),
             Catch::Contains("task 0 runs on node 1"));
}

TEST_CASE("variables that contradict each other are refused, naming them") {
  auto [changes, expected] = GENERATE(table<Env, std::string>({
      {{{"SLURM_STEP_NUM_NODES", "3"}},
       "SLURM_STEP_NUM_NODES=3 but SLURM_STEP_NODELIST=n[1-2] names 2 hosts"},
      {{{"SLURM_STEP_NODELIST", "n[1-3]"}}, "names 3 hosts"},
      {{{"SLURM_NODEID", "2"}}, "SLURM_NODEID=2 is not below SLURM_STEP_NUM_NODES=2"},
      {{{"SLURM_STEP_TASKS_PER_NODE", "1(x3)"}}, "describes 3 nodes but SLURM_STEP_NUM_NODES=2"},
      {{{"SLURM_STEP_NUM_TASKS", "3"}},
       "SLURM_STEP_NUM_TASKS=3 but SLURM_STEP_TASKS_PER_NODE=1(x2) adds up to 2"},
      {{{"SLURM_PROCID", "2"}}, "SLURM_PROCID=2 is not below the step's 2 tasks"},
      {{{"SLURM_JOB_NUM_NODES", "1"}}, "more nodes than its job"},
      {{{"SLURM_STEP_NODELIST", "n[1-2"}}, "SLURM_STEP_NODELIST: hostlist 'n[1-2': missing ']'"},
      {{{"SLURM_STEP_TASKS_PER_NODE", "1(x)"}}, "bad SLURM_TASKS_PER_NODE item"},
      {{{"SLURM_NODEID", "x"}}, "SLURM_NODEID=x is not a number"},
      {{{"SLURM_NODEID", ""}}, "SLURM_NODEID is not set"},
      {{{"SLURM_PROCID", ""}}, "SLURM_PROCID is not set"},
      {{{"SLURM_JOB_ID", "12_3"}}, "SLURM_JOB_ID=12_3 is not a job number"},
      {{{"SLURM_JOB_ID", ""}, {"SLURM_JOBID", ""}}, "SLURM_JOB_ID is not set"},
      {{{"SLURM_STEP_NUM_NODES", "0"}, {"SLURM_NNODES", ""}}, "SLURM_STEP_NUM_NODES is not set (or 0)"},
  }));
  INFO(expected);
  CHECK_THAT(derive_error(with(srun_env(), changes)), Catch::Contains(expected));
}

TEST_CASE("store port candidates: eight distinct ports below the ephemeral range, fixed per job") {
  for (uint64_t job : {0ull, 1ull, 9999ull, 10000ull, 123456789ull, 18446744073709551615ull}) {
    auto ports = slurm_port_candidates(job);
    REQUIRE(ports.size() == 8);
    CHECK(std::set<uint16_t>(ports.begin(), ports.end()).size() == 8);
    for (uint16_t p : ports) {
      CHECK(p >= 20000);
      CHECK(p < 30000);
    }
    CHECK(ports[0] == 20000 + job % 10000);
    CHECK(ports == slurm_port_candidates(job));
  }
  CHECK(slurm_port_candidates(12345)[1] == 23354);
  CHECK(slurm_port_candidates(41)[0] != slurm_port_candidates(42)[0]);
  CHECK(format_ports({20001, 21010}) == "20001,21010");
}

TEST_CASE("under srun ddprun takes the derived settings as defaults") {
  auto p = parse({"--nproc_per_node", "2", "train.py"}, srun_env());
  INFO(p.result.message);
  REQUIRE_FALSE(p.result.should_exit);
  const LaunchConfig& c = p.config;
  REQUIRE(c.slurm);
  CHECK(c.slurm->auto_detected);
  CHECK(c.min_nodes == 2);
  CHECK(c.max_nodes == 2);
  CHECK(c.node_rank == 1);
  CHECK(c.rdzv_id == "1");
  CHECK(c.rdzv_kind == RendezvousKind::kStatic);
  CHECK(c.rdzv_endpoint.to_string() == "n1:20001");            // --master_addr:--master_port, both derived
  CHECK(c.slurm->probe_ports == slurm_port_candidates(1));  // no port given: probed
  CHECK(c.slurm->store_host == "n1");
  CHECK_FALSE(c.slurm->hosts_store);
  CHECK(c.slurm->used.size() == 5);
  auto node0 = parse({"--nproc_per_node", "2", "train.py"},
                     with(srun_env(), {{"SLURM_NODEID", "0"}, {"SLURM_PROCID", "0"}}));
  REQUIRE(node0.config.slurm);
  CHECK(node0.config.slurm->hosts_store);
}

TEST_CASE("with --slurm a flag given still wins; a given port is not probed") {
  auto p =
      parse({"--slurm", "--master_port", "1234", "--rdzv_id", "mine", "--nproc_per_node", "2", "train.py"},
            srun_env());
  INFO(p.result.message);
  REQUIRE_FALSE(p.result.should_exit);
  REQUIRE(p.config.slurm);
  CHECK_FALSE(p.config.slurm->auto_detected);
  CHECK(p.config.rdzv_endpoint.port == 1234);
  CHECK(p.config.rdzv_id == "mine");
  CHECK(p.config.slurm->probe_ports.empty());
  CHECK(p.config.max_nodes == 2);
  for (const auto& d : p.config.slurm->used) {
    CHECK(d.setting != "--master_port");
    CHECK(d.setting != "--rdzv_id");
  }
}

TEST_CASE("torchrun-style Slurm glue turns auto-detection off") {
  auto [args, env] = GENERATE(table<Args, Env>({
      {{"--nnodes", "2"}, {}},
      {{"--node_rank", "0"}, {}},
      {{"--master_addr", "10.0.0.1"}, {}},
      {{"--master_port", "29501"}, {}},
      {{"--rdzv_endpoint", "n1:29400", "--rdzv_backend", "c10d"}, {}},
      {{"--standalone"}, {}},
      {{"--no_slurm"}, {}},
      {{"--no-slurm"}, {}},
      {{}, {{"PET_NNODES", "2"}}},
      {{}, {{"PET_MASTER_ADDR", "n1"}}},
  }));
  Args full = args;
  full.push_back("train.py");
  auto p = parse(full, with(srun_env(), env));
  INFO(p.result.message);
  REQUIRE_FALSE(p.result.should_exit);
  CHECK_FALSE(p.config.slurm);
  CHECK(p.config.rdzv_id != "1");
}

TEST_CASE("Slurm errors are usage errors (exit 2) that say how to get out") {
  auto outside = parse({"--slurm", "train.py"}, {});
  CHECK(outside.result.exit_code == 2);
  CHECK_THAT(outside.result.message, Catch::StartsWith("ddprun: --slurm: SLURM_JOB_ID is not set"));
  auto both = parse({"--slurm", "--no_slurm", "train.py"}, srun_env());
  CHECK(both.result.exit_code == 2);
  CHECK_THAT(both.result.message, Catch::Contains("cannot be used together"));
  auto standalone = parse({"--slurm", "--standalone", "train.py"}, srun_env());
  CHECK(standalone.result.exit_code == 2);
  auto batch = parse({"--nproc_per_node", "4", "train.py"}, batch_env());
  CHECK(batch.result.exit_code == 2);
  CHECK_THAT(batch.result.message, Catch::StartsWith("ddprun: Slurm job step detected") &&
                                       Catch::Contains("(--no_slurm ignores Slurm)"));
  auto tasks =
      parse({"--nproc_per_node", "2", "train.py"},
            with(srun_env(), {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"SLURM_STEP_NUM_TASKS", "4"}}));
  CHECK(tasks.result.exit_code == 2);
  CHECK_THAT(tasks.result.message, Catch::Contains("several tasks on a node"));
}

TEST_CASE("one agent per task with --nproc_per_node 1") {
  auto p = parse({"train.py"}, with(srun_env(), {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                                 {"SLURM_STEP_NUM_TASKS", "4"},
                                                 {"SLURM_PROCID", "2"}}));
  INFO(p.result.message);
  REQUIRE_FALSE(p.result.should_exit);
  CHECK(p.config.max_nodes == 4);
  CHECK(p.config.node_rank == 2);
  REQUIRE(p.config.slurm);
  CHECK(p.config.slurm->settings.task_mode);
}

TEST_CASE("c10d under Slurm: endpoint on the first host, agent 0 hosts the store") {
  auto p = parse({"--rdzv_backend", "c10d", "--nproc_per_node", "2", "train.py"}, srun_env());
  INFO(p.result.message);
  REQUIRE_FALSE(p.result.should_exit);
  REQUIRE(p.config.slurm);
  CHECK(p.config.rdzv_endpoint.to_string() == "n1:20001");
  CHECK(p.config.is_host == std::optional<bool>(false));
  CHECK(p.config.slurm->store_host == "n1");
  CHECK(p.config.slurm->probe_ports.size() == 8);
  for (const auto& d : p.config.slurm->used) CHECK(d.setting != "--master_addr");
  auto host = parse({"--slurm", "--rdzv_backend", "c10d", "--nnodes", "1:2", "train.py"},
                    with(srun_env(), {{"SLURM_NODEID", "0"}, {"SLURM_PROCID", "0"}}));
  INFO(host.result.message);
  REQUIRE(host.config.slurm);
  CHECK(host.config.min_nodes == 1);
  CHECK(host.config.max_nodes == 2);
  CHECK(host.config.is_host == std::optional<bool>(true));
  auto given =
      parse({"--slurm", "--rdzv_backend", "c10d", "--rdzv_endpoint", "h9:555", "train.py"}, srun_env());
  REQUIRE(given.config.slurm);
  CHECK(given.config.rdzv_endpoint.to_string() == "h9:555");
  CHECK(given.config.slurm->probe_ports.empty());
  CHECK_FALSE(given.config.is_host.has_value());
  auto chosen =
      parse({"--rdzv_backend", "c10d", "--rdzv_conf", "is_host=1", "train.py"}, srun_env());  // node 1
  REQUIRE(chosen.config.slurm);
  CHECK(chosen.config.slurm->hosts_store);
  CHECK(chosen.config.slurm->probe_ports.size() == 8);
}

TEST_CASE("dry run shows each derived setting and the variable it came from") {
  auto p = parse({"--nproc_per_node", "2", "--dry-run", "train.py"}, srun_env());
  REQUIRE(p.config.slurm);
  std::string text = format_slurm_launch(*p.config.slurm);
  CHECK_THAT(text,
             Catch::Contains("slurm:      detected (SLURM_JOB_ID, SLURM_PROCID") &&
                 Catch::Contains("job step 1.0, one agent per node, the store is on n1") &&
                 Catch::Contains("store port: first free of 20001,21010,") &&
                 Catch::Contains("    --nnodes 2  <- SLURM_STEP_NUM_NODES=2\n") &&
                 Catch::Contains("    --node_rank 1  <- SLURM_NODEID=1\n") &&
                 Catch::Contains("    --master_addr n1  <- SLURM_STEP_NODELIST=n[1-2] (first host)\n") &&
                 Catch::Contains("    --rdzv_id 1  <- SLURM_JOB_ID=1\n"));
  const std::string plan = dry_run(p.config, LauncherContext{});
  CHECK_THAT(plan, Catch::Contains(text));
  // Node 1 probes node 0's store port among the candidates; its ranks add up node 0's workers.
  CHECK_THAT(plan, Catch::Contains("    MASTER_ADDR=n1\n    MASTER_PORT=<probed among 20001,21010,"));
  CHECK_THAT(plan, Catch::Contains("    RANK=<decided at the rendezvous>\n"));
}
