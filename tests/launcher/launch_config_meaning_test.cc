// Unit tests of what the parsed ddprun command line means: the script's arguments, the worker's argv,
// streams, signals, rendezvous endpoints and conf, help, visible devices, ddprun-launch, torchrun 2.9+ flags,
// NUMA binding. launcher/launch_config.h; pure: no processes.
#include <csignal>
#include <sstream>
#include <thread>

#include "catch_compat.h"
#include "launch_config_test_util.h"
#include "launcher/launch_config.h"
#include "temp_dir.h"

namespace {

using namespace ddprun::launcher;
using namespace ddprun::launcher::test;  // parse(), join(), describe()

}  // namespace

TEST_CASE("everything after the script belongs to the script", "[launcher][cli]") {
  struct Row {
    Args args;
    std::string script;
    Args script_args;
    int nproc;
    bool module;
  };
  auto row = GENERATE(values<Row>({
      {{"--nproc_per_node", "2", "train.py", "--lr", "0.1", "--nproc_per_node", "5"},
       "train.py",
       {"--lr", "0.1", "--nproc_per_node", "5"},
       2,
       false},
      {{"train.py", "--help"}, "train.py", {"--help"}, 1, false},
      {{"train.py", "-m", "--version"}, "train.py", {"-m", "--version"}, 1, false},
      {{"train.py", "--", "-x", "--"}, "train.py", {"--", "-x", "--"}, 1, false},
      {{"--", "train.py", "-1"}, "train.py", {"-1"}, 1, false},
      {{"-m", "pkg.main", "a", "b c", ""}, "pkg.main", {"a", "b c", ""}, 1, true},
      {{"--nproc-per-node=3", "--module", "torch.distributed.run", "--nproc_per_node", "8"},
       "torch.distributed.run",
       {"--nproc_per_node", "8"},
       3,
       true},
      {{"--rdzv_conf=", "--log_dir=", "--nproc_per_node=2", "t.py", "--role="},
       "t.py",
       {"--role="},
       2,
       false},
      {{"-r", "1", "--rdzv-conf", "", "t.py", "--log_dir="}, "t.py", {"--log_dir="}, 1, false},
      {{"/abs/path with space/t.py", "x=${local_rank}"},
       "/abs/path with space/t.py",
       {"x=${local_rank}"},
       1,
       false},
  }));
  CAPTURE(join(row.args));
  auto o = parse(row.args);
  INFO(o.result.message);
  REQUIRE(o.result.exit_code == 0);
  CHECK(o.config.training_script == row.script);
  CHECK(o.config.training_script_args == row.script_args);
  CHECK(o.config.nproc_per_node == row.nproc);
  CHECK(o.config.module == row.module);
}

TEST_CASE("local_rank macro substitution follows Python's Template.safe_substitute", "[launcher][cli]") {
  struct Row {
    std::string in;
    int rank;
    std::string out;
  };
  auto row = GENERATE(values<Row>({
      {"${local_rank}", 3, "3"},
      {"--out=/x/${local_rank}/y", 12, "--out=/x/12/y"},
      {"$local_rank", 0, "0"},
      {"$local_rank.log", 5, "5.log"},
      {"$local_rankX", 5, "$local_rankX"},
      {"$$local_rank", 5, "$local_rank"},
      {"$${local_rank}", 5, "${local_rank}"},
      {"${local_rank", 5, "${local_rank"},
      {"${LOCAL_RANK}", 5, "${LOCAL_RANK}"},
      {"${other}$HOME", 5, "${other}$HOME"},
      {"$", 1, "$"},
      {"a$", 1, "a$"},
      {"$1", 1, "$1"},
      {"${local_rank}${local_rank}", 7, "77"},
      {"no macro", 1, "no macro"},
  }));
  CAPTURE(row.in);
  CHECK(substitute_local_rank(row.in, row.rank) == row.out);
}

TEST_CASE("worker argv for python -u and -m and no_python and run_path and the interpreter choice",
          "[launcher][cli]") {
  struct Row {
    Args args;
    Env env;
    Args argv_rank2;
    bool warns;
  };
  auto row = GENERATE(values<Row>({
      {{"t.py", "--rank=${local_rank}"}, {}, {"python3", "-u", "t.py", "--rank=2"}, false},
      {{"-m", "pkg.m", "$local_rank"}, {}, {"python3", "-u", "-m", "pkg.m", "2"}, false},
      {{"--no_python", "./bin/w${local_rank}", "${local_rank}"}, {}, {"./bin/w${local_rank}", "2"}, false},
      {{"--run_path", "/abs/t.py", "a"}, {}, {"python3", "-u", "/abs/t.py", "a"}, false},
      {{"--run_path", "-m", "/abs/t.py"}, {}, {"python3", "-u", "/abs/t.py"}, true},
      {{"--run_path", "--no_python", "/abs/t.py"}, {}, {"python3", "-u", "/abs/t.py"}, true},
      {{"data_${local_rank}.py"}, {}, {"python3", "-u", "data_2.py"}, false},
      {{"--python", "/usr/bin/python3", "t.py"},
       {{"DDPRUN_PYTHON", "/opt/py"}},
       {"/usr/bin/python3", "-u", "t.py"},
       false},
      {{"t.py"}, {{"DDPRUN_PYTHON", "/opt/py"}, {"PYTHON_EXEC", "/other"}}, {"/opt/py", "-u", "t.py"}, false},
      {{"t.py"}, {{"PYTHON_EXEC", "/other"}}, {"/other", "-u", "t.py"}, false},
  }));
  CAPTURE(join(row.args));
  auto o = parse(row.args, row.env);
  REQUIRE(o.result.exit_code == 0);
  REQUIRE_FALSE(o.result.should_exit);
  CHECK(o.config.worker_argv(2) == row.argv_rank2);
  CHECK(o.result.message.empty() != row.warns);
  if (row.warns) CHECK_THAT(o.result.message, Catch::StartsWith("ddprun: warning: --run_path"));
}

TEST_CASE("redirects and tee specs", "[launcher][cli]") {
  struct Row {
    std::string spec;
    bool ok;
    std::vector<Std> ranks_0_to_3;
  };
  using S = Std;
  auto row = GENERATE(values<Row>({
      {"0", true, {S::kNone, S::kNone, S::kNone, S::kNone}},
      {"1", true, {S::kOut, S::kOut, S::kOut, S::kOut}},
      {"2", true, {S::kErr, S::kErr, S::kErr, S::kErr}},
      {"3", true, {S::kAll, S::kAll, S::kAll, S::kAll}},
      {"0:1,1:2", true, {S::kOut, S::kErr, S::kNone, S::kNone}},
      {"3:3", true, {S::kNone, S::kNone, S::kNone, S::kAll}},
      {"2:1,0:3,2:2", true, {S::kAll, S::kNone, S::kErr, S::kNone}},  // last one wins
      {"4", false, {}},
      {"", false, {}},
      {"01", false, {}},
      {"0:4", false, {}},
      {":1", false, {}},
      {"0:", false, {}},
      {"0:1,", false, {}},
      {"-1:1", false, {}},
      {"1 ", false, {}},
  }));
  CAPTURE(row.spec);
  auto spec = parse_std_spec(row.spec);
  REQUIRE(spec.has_value() == row.ok);
  for (int r = 0; r < static_cast<int>(row.ranks_0_to_3.size()); ++r) {
    CHECK(spec->for_rank(r) == row.ranks_0_to_3[r]);
  }
  if (row.ok) CHECK(spec->for_rank(100) == (row.spec.size() == 1 ? row.ranks_0_to_3[0] : Std::kNone));
  // Through the command line (surrounding blanks are trimmed there).
  auto o = parse({"--tee", row.spec, "-r", row.spec, "t.py"});
  CHECK((o.result.exit_code == 0) == (row.ok || row.spec == "1 "));
}

TEST_CASE("signals_to_handle: names and numbers and order and duplicates", "[launcher][cli]") {
  struct Row {
    std::string spec;
    std::vector<int> sigs;
  };
  auto row = GENERATE(values<Row>({
      {"SIGTERM", {SIGTERM}},
      {"term", {SIGTERM}},
      {"sigusr2,SIGUSR1", {SIGUSR2, SIGUSR1}},
      {" SIGINT , HUP ", {SIGINT, SIGHUP}},
      {"15,SIGTERM,15", {SIGTERM}},
      {"SIGTERM,SIGINT,SIGHUP,SIGQUIT", {SIGTERM, SIGINT, SIGHUP, SIGQUIT}},
      {"SIGWINCH,34", {SIGWINCH, 34}},
  }));
  CAPTURE(row.spec);
  auto o = parse({"--signals-to-handle", row.spec, "t.py"});
  INFO(o.result.message);
  REQUIRE(o.result.exit_code == 0);
  CHECK(o.config.signals_to_handle == row.sigs);
}

TEST_CASE(
    "standalone: single-node c10d on a free port and explicit rendezvous flags overridden with a warning",
    "[launcher][cli]") {
  auto o = parse({"--standalone", "--nproc_per_node", "2", "t.py"});
  REQUIRE(o.result.exit_code == 0);
  CHECK(o.result.message.empty());
  CHECK(o.config.rdzv_kind == RendezvousKind::kStandalone);
  CHECK(o.config.rdzv_endpoint == ddprun::rdzv::Endpoint{"127.0.0.1", 0});  // the store binds a free port
  CHECK(o.config.min_nodes == 1);
  CHECK(o.config.max_nodes == 1);

  auto w = parse(
      {"--standalone", "--rdzv_endpoint", "h:1", "--rdzv-backend", "static", "--nnodes", "1:1", "t.py"});
  REQUIRE(w.result.exit_code == 0);
  REQUIRE_FALSE(w.result.should_exit);
  CHECK(w.config.rdzv_endpoint.to_string() == "127.0.0.1:0");
  CHECK(w.config.rdzv_kind == RendezvousKind::kStandalone);
  CHECK_THAT(w.result.message, Catch::Contains("ddprun: warning: --standalone ignores --rdzv_endpoint=h:1"));
  CHECK_THAT(w.result.message, Catch::Contains("--rdzv_backend=static"));
}

TEST_CASE("c10d endpoints and elasticity", "[launcher][cli]") {
  auto o = parse({"--nnodes", "1:4", "--rdzv_backend", "c10d", "--rdzv_endpoint", "[fe80::1]:29401",
                  "--node_rank", "7", "t.py"});
  REQUIRE(o.result.exit_code == 0);  // node_rank is ignored by the c10d backend, as in torchrun
  CHECK(o.config.rdzv_endpoint == ddprun::rdzv::Endpoint{"fe80::1", 29401});
  CHECK(o.config.rdzv_kind == RendezvousKind::kC10d);
  auto bare = parse({"--rdzv_backend", "c10d", "t.py"});
  REQUIRE(bare.result.exit_code == 0);
  CHECK(bare.config.rdzv_endpoint == ddprun::rdzv::Endpoint{"localhost", 29400});  // torchrun's default
  auto blank = parse({"--rdzv_backend", "c10d", "--rdzv_endpoint", " ", "t.py"});
  REQUIRE(blank.result.exit_code == 0);
  CHECK(blank.config.rdzv_endpoint == ddprun::rdzv::Endpoint{"localhost", 29400});
  // The static backend: --rdzv_endpoint stands for --master_addr:--master_port (as in torchrun).
  auto static_ep = parse({"--rdzv_endpoint", "[::1]:5000", "--nnodes", "2", "--node_rank", "1",
                          "--master_addr", "10.0.0.9", "t.py"});
  REQUIRE(static_ep.result.exit_code == 0);
  CHECK(static_ep.config.rdzv_kind == RendezvousKind::kStatic);
  CHECK(static_ep.config.rdzv_endpoint == ddprun::rdzv::Endpoint{"::1", 5000});
  auto master = parse({"--master_addr", "[::1]", "--master_port", "7", "t.py"});
  CHECK(master.config.rdzv_endpoint.to_string() == "[::1]:7");
}

TEST_CASE("rdzv_conf travels typed: timings with aliases resolved and is_host", "[launcher][cli]") {
  auto o =
      parse({"--rdzv_backend", "c10d", "--rdzv_conf", "timeout=45,heartbeat_timeout=20,is_host=n", "t.py"});
  REQUIRE(o.result.exit_code == 0);
  CHECK(o.config.rdzv_timings.join_timeout == 45);
  CHECK(o.config.rdzv_timings.keep_alive_max_attempt == 4);
  CHECK(o.config.is_host == std::optional<bool>(false));
  CHECK(parse({"--rdzv_conf", "is_host=1", "t.py"}).config.is_host == std::optional<bool>(true));
}

TEST_CASE("help and version exit 0 with text", "[launcher][cli]") {
  auto spelling = GENERATE(as<std::string>{}, "-h", "--help");
  auto o = parse({"--nproc_per_node", "2", spelling});
  CHECK(o.result.exit_code == 0);
  CHECK(o.result.should_exit);
  for (const char* name : {"training_script", "--nproc_per_node", "--nproc-per-node", "--rdzv_conf",
                           "-r,--redirects", "PET_NNODES", "--dry-run", "--exit_barrier_timeout"}) {
    CHECK_THAT(o.result.message, Catch::Contains(name));
  }
  auto v = parse({"--version"});
  CHECK(v.result.exit_code == 0);
  CHECK(v.result.should_exit);
  CHECK_THAT(v.result.message, Catch::StartsWith("ddprun "));
  CHECK_THAT(v.result.message, Catch::Contains(" (commit "));  // launcher/version.h: the build's commit
}

TEST_CASE("visible CUDA devices follow CUDA_VISIBLE_DEVICES like the CUDA runtime", "[launcher][cli]") {
  struct Row {
    int physical;
    std::optional<std::string> cvd;
    int expected;
  };
  auto row = GENERATE(values<Row>({
      {0, std::nullopt, 0},
      {8, std::nullopt, 8},
      {8, "", 0},
      {8, "-1", 0},
      {8, "0,1", 2},
      {8, " 3 , 5 ", 2},
      {8, "0,9,1", 1},  // stops at the first invalid index
      {8, "1,1", 1},    // and at a duplicate
      {2, "0,1,2,3", 2},
      {2, "GPU-8f5a,GPU-aa11", 2},
      {1, "MIG-1,MIG-2", 1},
      {0, "0", 0},
      {8, "NoDevFiles", 0},
  }));
  CAPTURE(row.physical, row.cvd.value_or("<unset>"));
  CHECK(visible_cuda_devices(row.physical, row.cvd) == row.expected);
  CHECK(count_cuda_devices() >= 0);
}

TEST_CASE("ddprun-launch: --local-rank=N before the script's arguments unless --use_env") {
  auto launch = [](const Args& args) {
    Args argv{"/usr/bin/ddprun-launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    Outcome o;
    o.result = parse_launch_config(
        argv, {}, [] { return 0; }, o.config);
    return o;
  };
  auto dash = launch({"--local-rank-style", "dash", "--python", "py", "t.py", "a"});
  REQUIRE_FALSE(dash.result.should_exit);
  CHECK(dash.config.worker_argv(1) == std::vector<std::string>{"py", "-u", "t.py", "--local-rank=1", "a"});
  auto underscore = launch({"--local_rank_style=underscore", "--python", "py", "-m", "pkg.mod"});
  CHECK(underscore.config.worker_argv(0) ==
        std::vector<std::string>{"py", "-u", "-m", "pkg.mod", "--local_rank=0"});
  CHECK(launch({"t.py"}).config.local_rank_arg == "auto");  // main() asks the workers' torch
  auto use_env = launch({"--use_env", "--python", "py", "t.py", "a"});
  CHECK(use_env.config.local_rank_arg.empty());
  CHECK(use_env.config.worker_argv(0) == std::vector<std::string>{"py", "-u", "t.py", "a"});
  auto no_python = launch({"--no_python", "prog"});
  CHECK(no_python.result.exit_code == 2);
  CHECK_THAT(no_python.result.message, Catch::Contains("--no_python needs --use_env"));
  CHECK(launch({"--local_rank_style", "camel", "t.py"}).result.exit_code == 2);
  // ddprun itself knows neither flag (torchrun does not).
  CHECK(parse({"--use_env", "t.py"}).result.exit_code == 2);
  CHECK(parse({"t.py"}).config.local_rank_arg.empty());
}

TEST_CASE("invoked as torchrun (a link to ddprun, first on PATH), ddprun is ddprun", "[launcher][cli]") {
  // Kubeflow Trainer v2's torch runtime runs the literal `torchrun` with PET_* variables
  // (docs/kubernetes.md).
  const Env pet{{"PET_NNODES", "2"},
                {"PET_NPROC_PER_NODE", "3"},
                {"PET_NODE_RANK", "1"},
                {"PET_MASTER_ADDR", "train-node-0-0.train"},
                {"PET_MASTER_PORT", "29500"}};
  Outcome as_torchrun;
  as_torchrun.result = parse_launch_config(
      {"/usr/local/bin/torchrun", "--python", "py", "t.py", "a"}, pet, [] { return 0; }, as_torchrun.config);
  const Outcome as_ddprun = parse({"--python", "py", "t.py", "a"}, pet);
  REQUIRE_FALSE(as_torchrun.result.should_exit);
  CHECK(as_torchrun.result.message == as_ddprun.result.message);
  const LaunchConfig& c = as_torchrun.config;
  CHECK(c.min_nodes == 2);
  CHECK(c.nproc_per_node == 3);
  CHECK(c.node_rank == 1);
  CHECK(c.rdzv_endpoint == ddprun::rdzv::Endpoint{"train-node-0-0.train", 29500});
  CHECK(c.local_rank_arg.empty());  // not ddprun-launch: no --local-rank=N for the script
  CHECK(c.worker_argv(2) == as_ddprun.config.worker_argv(2));
  Outcome version;
  version.result = parse_launch_config(
      {"torchrun", "--version"}, {}, [] { return 0; }, version.config);
  CHECK_THAT(version.result.message, Catch::StartsWith("ddprun "));
}

TEST_CASE("rdzv_endpoint: c10d takes a list tried in order; rdzv_conf failover", "[launcher][cli]") {
  auto o = parse({"--nnodes", "2:4", "--rdzv_backend", "c10d", "--rdzv_endpoint", " h1:29400, [::1] ,h3:7",
                  "--rdzv_conf", "failover=no", "t.py"});
  REQUIRE_FALSE(o.result.should_exit);
  const LaunchConfig& c = o.config;
  CHECK(c.rdzv_endpoint == ddprun::rdzv::Endpoint{"h1", 29400});
  REQUIRE(c.rdzv_fallbacks.size() == 2);
  CHECK(c.rdzv_fallbacks[0] == ddprun::rdzv::Endpoint{"::1", 29400});  // c10d's default port
  CHECK(c.rdzv_fallbacks[1] == ddprun::rdzv::Endpoint{"h3", 7});
  CHECK_FALSE(c.store_failover);
  auto d = parse({"--nnodes", "2:4", "--rdzv_backend", "c10d", "--rdzv_endpoint", "h1", "t.py"});
  REQUIRE_FALSE(d.result.should_exit);
  CHECK(d.config.rdzv_fallbacks.empty());
  CHECK(d.config.store_failover);
}

TEST_CASE("torchrun 2.9+ flags: virtual local rank, duplicate filters, event log handler",
          "[launcher][cli]") {
  SECTION("defaults: off, none, null") {
    auto o = parse({"train.py"});
    CHECK_FALSE(o.config.virtual_local_rank);
    CHECK(o.config.duplicate_stdout_filters.empty());
    CHECK(o.config.duplicate_stderr_filters.empty());
    CHECK(o.config.event_log_handler == EventLogHandler::kNull);
    CHECK_FALSE(o.config.numa_binding);
    CHECK(o.config.worker_cpus.empty());
  }
  SECTION("--virtual-local-rank: both spellings and PET_VIRTUAL_LOCAL_RANK") {
    CHECK(parse({"--virtual-local-rank", "train.py"}).config.virtual_local_rank);
    CHECK(parse({"--virtual_local_rank", "train.py"}).config.virtual_local_rank);
    CHECK(parse({"train.py"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"}}).config.virtual_local_rank);
    CHECK_FALSE(parse({"train.py"}, {{"PET_VIRTUAL_LOCAL_RANK", "0"}}).config.virtual_local_rank);
  }
  SECTION("--virtual-local-rank: a CUDA_VISIBLE_DEVICES shorter than the local ranks is refused") {
    auto ok = parse({"--virtual-local-rank", "--nproc_per_node", "2", "train.py"},
                    {{"CUDA_VISIBLE_DEVICES", "3,5"}});
    CHECK(ok.result.exit_code == 0);
    auto o = parse({"--virtual-local-rank", "--nproc_per_node", "3", "train.py"},
                   {{"CUDA_VISIBLE_DEVICES", "3,5"}});
    CHECK(o.result.exit_code == 2);
    CHECK_THAT(o.result.message, Catch::Contains("--virtual-local-rank gives local rank 2 its entry of "
                                                 "CUDA_VISIBLE_DEVICES='3,5', which has only 2"));
    // Unset: each local rank is its own device, no limit.
    CHECK(parse({"--virtual-local-rank", "--nproc_per_node", "3", "train.py"}).result.exit_code == 0);
  }
  SECTION("duplicate filters: torchrun's comma-separated list, ',,' for a comma, PET_ variables") {
    auto o =
        parse({"--duplicate-stdout-filters", "loss,acc", "--duplicate_stderr_filters=a,,b,c", "train.py"});
    CHECK(o.config.duplicate_stdout_filters == std::vector<std::string>{"loss", "acc"});
    CHECK(o.config.duplicate_stderr_filters == std::vector<std::string>{"a,b", "c"});
    CHECK(o.result.message.find("warning") == std::string::npos);  // applied by the agent, no warning
    auto e =
        parse({"train.py"}, {{"PET_DUPLICATE_STDOUT_FILTERS", "x"}, {"PET_DUPLICATE_STDERR_FILTERS", "y,z"}});
    CHECK(e.config.duplicate_stdout_filters == std::vector<std::string>{"x"});
    CHECK(e.config.duplicate_stderr_filters == std::vector<std::string>{"y", "z"});
    CHECK(comma_separated_list("") == std::vector<std::string>{""});
    CHECK(comma_separated_list("a,") == std::vector<std::string>{"a", ""});
    CHECK(comma_separated_list(",,,x") == std::vector<std::string>{",", "x"});
  }
  SECTION("event log handler: torch's three names, PET_EVENT_LOG_HANDLER, others refused") {
    CHECK(parse({"--event-log-handler", "console", "train.py"}).config.event_log_handler ==
          EventLogHandler::kConsole);
    CHECK(parse({"--event_log_handler=dynamic_rendezvous", "train.py"}).config.event_log_handler ==
          EventLogHandler::kDynamicRendezvous);
    CHECK(parse({"train.py"}, {{"PET_EVENT_LOG_HANDLER", "console"}}).config.event_log_handler ==
          EventLogHandler::kConsole);
    auto o = parse({"--event-log-handler", "file", "train.py"});
    CHECK(o.result.exit_code == 2);
    CHECK(o.result.message ==
          "ddprun: invalid --event_log_handler value 'file': expected one of null, console, "
          "dynamic_rendezvous, file:PATH");
    o = parse({"--event_log_handler", "file:/var/log/ddprun/events.jsonl", "train.py"});
    CHECK(o.config.event_log_file == "/var/log/ddprun/events.jsonl");
    CHECK(o.config.event_log_handler == EventLogHandler::kNull);  // torch's events: not printed
    o = parse({"--event_log_handler", "file:", "train.py"});
    CHECK(o.result.exit_code == 2);
    CHECK_THAT(o.result.message, Catch::Contains("file:PATH with a path"));
  }
  SECTION("--straggler_factor: above 1, or 0 for off") {
    CHECK(parse({"train.py"}).config.straggler_factor == 1.5);
    CHECK(parse({"--straggler_factor", "2", "train.py"}).config.straggler_factor == 2.0);
    CHECK(parse({"train.py"}, {{"PET_STRAGGLER_FACTOR", "0"}}).config.straggler_factor == 0.0);
    for (const char* bad : {"1", "0.5", "-2", "x", "1e9"}) {
      auto o = parse({"--straggler_factor", bad, "train.py"});
      CHECK(o.result.exit_code == 2);
      CHECK_THAT(o.result.message, Catch::Contains("a factor above 1 (e.g. 1.5), or 0 for off"));
    }
  }
}

namespace {

// Two GPUs on NUMA node 1 (CPUs 4-7, no hyperthreads, one L3), node 0 has CPUs 0-3.
ddprun::launcher::NumaMachine two_gpus_on_node_1() {
  ddprun::launcher::NumaMachine m;
  m.nodes = {0, 1};
  m.node_cpus = {{0, {0, 1, 2, 3}}, {1, {4, 5, 6, 7}}};
  for (int c = 0; c < 8; ++c) {
    m.cpu_package[c] = 0;
    m.cpu_siblings[c] = {c};
    m.cpu_llc[c] = c < 4 ? std::set<int>{0, 1, 2, 3} : std::set<int>{4, 5, 6, 7};
  }
  m.gpu_nodes = {1, 1};
  m.allowed_cpus = {0, 1, 2, 3, 4, 5, 6, 7};
  return m;
}

Outcome parse_numa(const Args& args, const ddprun::launcher::NumaMachine& machine) {
  Args argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  Outcome o;
  o.result = parse_launch_config(argv, {}, {}, o.config, [&] { return machine; });
  return o;
}

}  // namespace

TEST_CASE("numa binding (--numa-binding) chooses each local rank's CPUs at parse time", "[launcher][cli]") {
  const auto m = two_gpus_on_node_1();
  auto node = parse_numa({"--numa-binding", "node", "--nproc_per_node", "2", "train.py"}, m);
  REQUIRE(node.result.exit_code == 0);
  CHECK(node.config.numa_binding == ddprun::launcher::NumaAffinity::kNode);
  CHECK(node.config.worker_cpus == std::vector<std::vector<int>>{{4, 5, 6, 7}, {4, 5, 6, 7}});
  auto exclusive = parse_numa({"--numa_binding=exclusive", "--nproc_per_node", "2", "train.py"}, m);
  CHECK(exclusive.config.worker_cpus == std::vector<std::vector<int>>{{4, 5}, {6, 7}});

  SECTION("a local rank without a GPU: exit 2 before anything starts") {
    auto o = parse_numa({"--numa-binding", "node", "--nproc_per_node", "3", "train.py"}, m);
    CHECK(o.result.exit_code == 2);
    CHECK_THAT(o.result.message,
               Catch::StartsWith("ddprun: --numa-binding=node: local rank 2 has no GPU 2 (2 "
                                 "NVIDIA GPUs visible)"));
  }
  SECTION("unknown modes are refused; torchrun has no PET_NUMA_BINDING") {
    auto o = parse_numa({"--numa-binding", "core_complex", "train.py"}, m);
    CHECK(o.result.exit_code == 2);
    CHECK(o.result.message ==
          "ddprun: invalid --numa_binding value 'core_complex': expected node, socket, exclusive or "
          "core-complex");
    Args argv{"ddprun", "train.py"};
    LaunchConfig c;
    parse_launch_config(argv, {{"PET_NUMA_BINDING", "node"}}, {}, c, [&] { return m; });
    CHECK_FALSE(c.numa_binding);
  }
}

TEST_CASE("etcd backends: members, port 2379, torchrun's rdzv_conf keys per backend", "[launcher][cli]") {
  auto o = parse({"--nnodes", "2:3", "--rdzv_backend", "etcd", "--rdzv_endpoint", "e1, e2:2380",
                  "--rdzv_conf", "protocol=HTTPS,etcd_prefix=/my/prefix,last_call_timeout=2", "t.py"});
  REQUIRE(o.result.exit_code == 0);
  CHECK(o.config.rdzv_kind == RendezvousKind::kEtcd);
  CHECK(o.config.rdzv_endpoint == ddprun::rdzv::Endpoint{"e1", 2379});  // etcd's client port by default
  REQUIRE(o.config.rdzv_fallbacks.size() == 1);
  CHECK(o.config.rdzv_fallbacks[0] == ddprun::rdzv::Endpoint{"e2", 2380});
  CHECK(o.config.etcd.https);
  CHECK(o.config.etcd.prefix == "/my/prefix");
  CHECK(o.config.rdzv_timings.last_call_timeout == 2);
  CHECK((o.config.min_nodes == 2 && o.config.max_nodes == 3));  // elastic, as c10d

  auto bare = parse({"--rdzv_backend", "etcd-v2", "t.py"});
  REQUIRE(bare.result.exit_code == 0);
  CHECK(bare.config.rdzv_kind == RendezvousKind::kEtcdV2);
  CHECK(bare.config.rdzv_endpoint == ddprun::rdzv::Endpoint{"localhost", 2379});
  CHECK_FALSE(bare.config.etcd.https);

  // torchrun's names differ per backend: etcd's cacert/cert/key, etcd-v2's ca_cert/ssl_cert/ssl_cert_key.
  ddprun::testing::TempDir dir;
  const std::string pem = dir.write("x.pem", "not read here\n").string();
  auto legacy = parse({"--rdzv_backend", "etcd", "--rdzv_conf",
                       "protocol=https,cacert=" + pem + ",cert=" + pem + ",key=" + pem, "t.py"});
  REQUIRE(legacy.result.exit_code == 0);
  CHECK(legacy.config.etcd.ca_file == pem);
  CHECK(legacy.config.etcd.cert_file == pem);
  CHECK(legacy.config.etcd.key_file == pem);
  auto v2 = parse({"--rdzv_backend", "etcd-v2", "--rdzv_conf",
                   "protocol=https,ca_cert=" + pem + ",ssl_cert=" + pem + ",ssl_cert_key=" + pem, "t.py"});
  REQUIRE(v2.result.exit_code == 0);
  CHECK(v2.config.etcd.ca_file == pem);
  CHECK(v2.config.etcd.cert_file == pem);
  CHECK(v2.config.etcd.key_file == pem);
  // The other backend's name for a file is not read: said, not silently ignored.
  auto crossed = parse({"--rdzv_backend", "etcd", "--rdzv_conf", "protocol=https,ssl_cert=" + pem, "t.py"});
  REQUIRE(crossed.result.exit_code == 0);
  CHECK_THAT(crossed.result.message,
             Catch::Contains("ssl_cert=" + pem + " is not used: it is etcd-v2's name") &&
                 Catch::Contains("reads cert="));
  // A TLS file without https is not used: said, not an error.
  auto plain = parse({"--rdzv_backend", "etcd", "--rdzv_conf", "cacert=" + pem, "t.py"});
  REQUIRE(plain.result.exit_code == 0);
  CHECK_THAT(plain.result.message, Catch::Contains("cacert=" + pem + " is not used without protocol=https"));
}
