// Unit tests of the ddprun command line, launcher/launch_config.h: defaults, every flag's spellings and PET_
// variable, bad values. What the parsed flags mean (script arguments, worker argv, streams, signals,
// rendezvous, ddprun-launch, NUMA): launch_config_meaning_test.cc. Pure: no processes.
#include "launcher/launch_config.h"

#include <csignal>
#include <sstream>
#include <thread>

#include "catch_compat.h"
#include "launch_config_test_util.h"

namespace {

using namespace ddprun::launcher;
using namespace ddprun::launcher::test;  // parse(), join(), describe()

// One value flag: all its spellings, its PET_ variable ("" = none), extra arguments it needs, a value, and
// the config field it sets, printed.
struct ValueFlag {
  std::vector<std::string> spellings;
  std::string pet;
  Args extra;
  std::string value;
  std::function<std::string(const LaunchConfig&)> field;
  std::string expected;
};

std::vector<ValueFlag> value_flags() {
  using C = const LaunchConfig&;
  auto nodes = [](C c) { return std::to_string(c.min_nodes) + ":" + std::to_string(c.max_nodes); };
  auto num = [](auto v) { return std::to_string(v); };
  auto conf = [](C c) {
    std::string s = c.is_host ? (*c.is_host ? "is_host=true;" : "is_host=false;") : "";
    const RdzvTimings& t = c.rdzv_timings;
    return s + "join_timeout=" + std::to_string(int(t.join_timeout)) +
           ";read_timeout=" + std::to_string(int(t.read_timeout)) + ";";
  };
  auto filter = [](C c) {
    if (!c.local_ranks_filter) return std::string("all");
    std::vector<std::string> s;
    for (int r : *c.local_ranks_filter) s.push_back(std::to_string(r));
    return join(s);
  };
  auto signals = [](C c) {
    std::vector<std::string> s;
    for (int x : c.signals_to_handle) s.push_back(std::to_string(x));
    return join(s);
  };
  // clang-format off
  return {
      {{"--nnodes"}, "PET_NNODES", {}, "3", nodes, "3:3"},
      {{"--nnodes"}, "PET_NNODES", {"--rdzv_backend", "c10d"}, "2:4", nodes, "2:4"},
      {{"--nproc_per_node", "--nproc-per-node"}, "PET_NPROC_PER_NODE", {}, "4",
       [=](C c) { return num(c.nproc_per_node) + " " + c.nproc_spec; }, "4 4"},
      {{"--rdzv_backend", "--rdzv-backend"}, "PET_RDZV_BACKEND", {}, "c10d",
       [=](C c) { return num(int(c.rdzv_kind == RendezvousKind::kC10d)); }, "1"},
      {{"--rdzv_endpoint", "--rdzv-endpoint"}, "PET_RDZV_ENDPOINT", {}, "10.0.0.1:1234",
       [](C c) { return c.rdzv_endpoint.to_string(); }, "10.0.0.1:1234"},
      {{"--rdzv_endpoint", "--rdzv-endpoint"}, "PET_RDZV_ENDPOINT", {"--rdzv_backend", "c10d"}, "[::1]",
       [](C c) { return c.rdzv_endpoint.to_string(); }, "[::1]:29400"},
      {{"--rdzv_id", "--rdzv-id"}, "PET_RDZV_ID", {}, "job7", [](C c) { return c.rdzv_id; }, "job7"},
      {{"--rdzv_conf", "--rdzv-conf"}, "PET_RDZV_CONF", {}, "join_timeout=060, is_host=Yes,read_timeout=5", conf,
       "is_host=true;join_timeout=60;read_timeout=5;"},
      {{"--max_restarts", "--max-restarts"}, "PET_MAX_RESTARTS", {}, "3", [=](C c) { return num(c.max_restarts); }, "3"},
      {{"--max_no_progress_restarts", "--max-no-progress-restarts"}, "PET_MAX_NO_PROGRESS_RESTARTS", {}, "2", [=](C c) { return num(c.max_no_progress_restarts); }, "2"},
      {{"--monitor_interval", "--monitor-interval"}, "PET_MONITOR_INTERVAL", {}, "5",
       [=](C c) { return num(c.monitor_interval); }, "5.000000"},
      {{"--start_method", "--start-method"}, "PET_START_METHOD", {}, "fork", [](C c) { return c.start_method; }, "fork"},
      {{"--role"}, "PET_ROLE", {}, "trainer", [](C c) { return c.role; }, "trainer"},
      {{"--log_dir", "--log-dir"}, "PET_LOG_DIR", {}, "/tmp/logs", [](C c) { return c.log_dir; }, "/tmp/logs"},
      {{"-r", "--redirects"}, "PET_REDIRECTS", {}, "3", [](C c) { return describe(c.redirects); }, "3"},
      {{"-t", "--tee"}, "PET_TEE", {}, "0:1,1:2", [](C c) { return describe(c.tee); }, "0:1,1:2"},
      {{"--local_ranks_filter", "--local-ranks-filter"}, "PET_LOCAL_RANKS_FILTER", {}, "2,0", filter, "0 2"},
      {{"--node_rank", "--node-rank"}, "PET_NODE_RANK", {"--nnodes", "2"}, "1", [=](C c) { return num(c.node_rank); }, "1"},
      {{"--master_addr", "--master-addr"}, "PET_MASTER_ADDR", {}, "10.1.2.3", [](C c) { return c.rdzv_endpoint.host; }, "10.1.2.3"},
      {{"--master_addr", "--master-addr"}, "PET_MASTER_ADDR", {}, "[::1]", [](C c) { return c.rdzv_endpoint.host; }, "::1"},
      {{"--master_port", "--master-port"}, "PET_MASTER_PORT", {}, "1234", [=](C c) { return num(c.rdzv_endpoint.port); }, "1234"},
      {{"--local_addr", "--local-addr"}, "PET_LOCAL_ADDR", {}, "node7", [](C c) { return c.local_addr; }, "node7"},
      {{"--signals_to_handle", "--signals-to-handle"}, "PET_SIGNALS_TO_HANDLE", {}, "SIGUSR1,15", signals,
       num(SIGUSR1) + " 15"},
      {{"--shutdown_timeout", "--shutdown-timeout"}, "PET_SHUTDOWN_TIMEOUT", {}, "2.5",
       [=](C c) { return num(c.shutdown_timeout); }, "2.500000"},
      {{"--exit_barrier_timeout", "--exit-barrier-timeout"}, "", {}, "10",
       [=](C c) { return num(c.exit_barrier_timeout); }, "10.000000"},
      {{"--store_memory_budget", "--store-memory-budget"}, "PET_STORE_MEMORY_BUDGET", {}, "512M",
       [=](C c) { return num(c.store_memory_budget); }, "536870912"},
      {{"--store_memory_budget", "--store-memory-budget"}, "PET_STORE_MEMORY_BUDGET", {}, " 1gib ",
       [=](C c) { return num(c.store_memory_budget); }, "1073741824"},
      {{"--python"}, "", {}, "/usr/bin/python3", [](C c) { return c.python; }, "/usr/bin/python3"},
      {{"--log_level", "--log-level"}, "", {}, "debug", [](C c) { return c.log_level; }, "debug"},
      {{"--log_level", "--log-level"}, "", {}, "warning", [](C c) { return c.log_level; }, "warn"},
      {{"--health_check", "--health-check"}, "PET_HEALTH_CHECK", {}, " nvidia-smi -q ", [](C c) { return c.health.command; }, "nvidia-smi -q"},
      {{"--health_check_timeout", "--health-check-timeout"}, "PET_HEALTH_CHECK_TIMEOUT", {}, "2.5",
       [=](C c) { return num(c.health.command_timeout.count()); }, "2500"},
      {{"--health_check_interval", "--health-check-interval"}, "PET_HEALTH_CHECK_INTERVAL", {}, "0",
       [=](C c) { return num(c.health.retry_interval.count()); }, "0"},
      {{"--health_check_attempts", "--health-check-attempts"}, "PET_HEALTH_CHECK_ATTEMPTS", {}, "5",
       [=](C c) { return num(c.health.attempts); }, "5"},
      {{"--health_check_builtin", "--health-check-builtin"}, "PET_HEALTH_CHECK_BUILTIN", {}, "off",
       [=](C c) { return num(int(c.health.builtin)); }, "0"},
      {{"--metrics_port", "--metrics-port"}, "PET_METRICS_PORT", {}, "9100", [=](C c) { return num(c.metrics_port); }, "9100"},
      {{"--metrics_addr", "--metrics-addr"}, "PET_METRICS_ADDR", {}, " 10.0.0.5 ", [](C c) { return c.metrics_addr; }, "10.0.0.5"},
      {{"--gpu_memory_wait", "--gpu-memory-wait"}, "PET_GPU_MEMORY_WAIT", {}, "0.25",
       [=](C c) { return num(c.health.gpu_memory_wait.count()); }, "250"},
  };
  // clang-format on
}

}  // namespace

TEST_CASE("defaults match torchrun's (and ddprun's documented ones)", "[launcher][cli]") {
  auto o = parse({"train.py"});
  REQUIRE(o.result.exit_code == 0);
  REQUIRE_FALSE(o.result.should_exit);
  REQUIRE(o.result.message.empty());
  const LaunchConfig& c = o.config;
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 1);
  CHECK(c.nproc_per_node == 1);
  CHECK(c.nproc_spec == "1");
  CHECK(c.rdzv_kind == RendezvousKind::kStatic);
  CHECK(c.rdzv_endpoint == ddprun::rdzv::Endpoint{"127.0.0.1", 29500});  // --master_addr:--master_port
  CHECK(c.rdzv_id == "none");
  CHECK(c.rdzv_timings.join_timeout == 600);
  CHECK(c.rdzv_timings.keep_alive_max_attempt == 3);
  CHECK_FALSE(c.is_host.has_value());
  CHECK(c.max_restarts == 0);
  CHECK(c.monitor_interval == 0.1);
  CHECK(c.start_method == "spawn");
  CHECK(c.role == "default");
  CHECK_FALSE((c.module || c.no_python || c.run_path || c.dry_run));
  CHECK(c.log_dir.empty());
  CHECK(c.redirects == StdSpec{});
  CHECK(c.tee == StdSpec{});
  CHECK_FALSE(c.local_ranks_filter.has_value());
  CHECK(c.node_rank == 0);
  CHECK(c.local_addr.empty());
  CHECK(c.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2});
  CHECK(c.shutdown_timeout == 30);
  CHECK(c.exit_barrier_timeout == 300);
  CHECK(c.store_memory_budget == uint64_t{256} << 20);  // ddprun extension: docs/cli.md says why
  CHECK(c.python == "python3");
  CHECK(c.log_level == "info");
  CHECK(c.health.command.empty());  // ddprun extensions: docs/cli.md
  CHECK(c.health.builtin);
  CHECK(c.health.attempts == 3);
  CHECK(c.health.command_timeout == std::chrono::seconds(60));
  CHECK(c.health.retry_interval == std::chrono::seconds(10));
  CHECK(c.health.gpu_memory_wait == std::chrono::seconds(30));
  CHECK(c.metrics_port == 0);
  CHECK(c.training_script == "train.py");
  CHECK(c.training_script_args.empty());
  CHECK(o.gpu_calls == 0);
  CHECK(c.worker_argv(0) == Args{"python3", "-u", "train.py"});
}

TEST_CASE("every value flag: both spellings and flag=value and the PET_ variable", "[launcher][cli]") {
  auto row = GENERATE(from_range(value_flags()));
  CAPTURE(row.spellings.back(), row.value);
  for (const auto& spelling : row.spellings) {
    CAPTURE(spelling);
    Args separate = row.extra, joined = row.extra;
    separate.insert(separate.end(), {spelling, row.value, "train.py"});
    joined.insert(joined.end(),
                  {spelling.size() == 2 ? spelling + row.value : spelling + "=" + row.value, "train.py"});
    for (const auto& args : {separate, joined}) {
      auto o = parse(args);
      INFO(o.result.message);
      REQUIRE(o.result.exit_code == 0);
      REQUIRE_FALSE(o.result.should_exit);
      CHECK(row.field(o.config) == row.expected);
      CHECK(o.config.training_script == "train.py");
      CHECK(o.config.training_script_args.empty());
    }
  }
  if (!row.pet.empty()) {
    Args args = row.extra;
    args.push_back("train.py");
    auto o = parse(args, {{row.pet, row.value}});
    INFO(o.result.message);
    REQUIRE(o.result.exit_code == 0);
    CHECK(row.field(o.config) == row.expected);
  }
}

TEST_CASE("boolean flags: both spellings and PET_ variables (non-zero integer = on)", "[launcher][cli]") {
  using C = const LaunchConfig&;
  struct Row {
    std::vector<std::string> spellings;
    std::string pet;
    std::function<bool(C)> field;
  };
  auto row = GENERATE(values<Row>({
      {{"--standalone"}, "PET_STANDALONE", [](C c) { return c.rdzv_kind == RendezvousKind::kStandalone; }},
      {{"-m", "--module"}, "PET_MODULE", [](C c) { return c.module; }},
      {{"--no_python", "--no-python"}, "PET_NO_PYTHON", [](C c) { return c.no_python; }},
      {{"--run_path", "--run-path"}, "PET_RUN_PATH", [](C c) { return c.run_path; }},
      {{"--dry_run", "--dry-run"}, "", [](C c) { return c.dry_run; }},
  }));
  CAPTURE(row.spellings.back());
  CHECK_FALSE(row.field(parse({"train.py"}).config));
  for (const auto& spelling : row.spellings) {
    auto o = parse({spelling, "train.py"});
    INFO(spelling << ": " << o.result.message);
    REQUIRE(o.result.exit_code == 0);
    CHECK(row.field(o.config));
  }
  if (!row.pet.empty()) {
    CHECK(row.field(parse({"train.py"}, {{row.pet, "1"}}).config));
    CHECK(row.field(parse({"train.py"}, {{row.pet, "2"}}).config));
    CHECK_FALSE(row.field(parse({"train.py"}, {{row.pet, "0"}}).config));
    CHECK(row.field(parse({row.spellings.back(), "train.py"}, {{row.pet, "0"}}).config));  // the flag wins
    auto bad = parse({"train.py"}, {{row.pet, "yes"}});
    CHECK(bad.result.exit_code == 2);
    CHECK_THAT(bad.result.message, Catch::Contains(row.pet));
  }
}

TEST_CASE("command-line flags win over PET_ variables and empty PET_ variables are ignored",
          "[launcher][cli]") {
  auto o = parse({"--nproc_per_node", "2", "--master-port=1", "train.py"},
                 {{"PET_NPROC_PER_NODE", "4"}, {"PET_MASTER_PORT", "x"}, {"PET_NNODES", ""}});
  REQUIRE(o.result.exit_code == 0);
  CHECK(o.config.nproc_per_node == 2);
  CHECK(o.config.rdzv_endpoint.port == 1);
  CHECK(o.config.min_nodes == 1);
  // Unrelated variables are not read.
  auto p = parse({"train.py"}, {{"NNODES", "4"}, {"MASTER_PORT", "1"}, {"nproc_per_node", "3"}});
  CHECK(p.config.min_nodes == 1);
  CHECK(p.config.rdzv_endpoint.port == 29500);
  CHECK(p.config.nproc_per_node == 1);
  // A repeated flag: the last one wins, as with argparse.
  CHECK(parse({"--nproc_per_node", "2", "--nproc-per-node", "3", "train.py"}).config.nproc_per_node == 3);
}

TEST_CASE("nproc_per_node cpu and gpu and auto", "[launcher][cli]") {
  const int cpus = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  struct Row {
    std::string spec;
    int gpus;
    int expected;
  };
  auto row = GENERATE_COPY(values<Row>(
      {{"cpu", 4, cpus}, {"gpu", 4, 4}, {"gpu", 1, 1}, {"auto", 2, 2}, {"auto", 0, cpus}, {"7", 3, 7}}));
  CAPTURE(row.spec, row.gpus);
  for (bool from_env : {false, true}) {
    auto o = from_env ? parse({"train.py"}, {{"PET_NPROC_PER_NODE", row.spec}}, row.gpus)
                      : parse({"--nproc_per_node", row.spec, "train.py"}, {}, row.gpus);
    REQUIRE(o.result.exit_code == 0);
    CHECK(o.config.nproc_per_node == row.expected);
    CHECK(o.config.nproc_spec == row.spec);
    CHECK(o.gpu_calls == ((row.spec == "gpu" || row.spec == "auto") ? 1 : 0));
  }
  auto none = parse({"--nproc_per_node", "gpu", "train.py"}, {}, 0);
  CHECK(none.result.exit_code == 2);
  CHECK(none.result.message == "ddprun: --nproc_per_node=gpu but no GPU (CUDA or ROCm) is visible");
}

TEST_CASE("bad values: exit code 2 and one message naming the flag and the value", "[launcher][cli]") {
  struct Row {
    Args args;
    Env env;
    std::vector<std::string> mentions;  // substrings the message must contain
  };
  auto row = GENERATE(values<Row>({
      {{"--nnodes", "0", "t.py"}, {}, {"--nnodes", "'0'", "MIN:MAX"}},
      {{"--nnodes", "3:2", "t.py"}, {}, {"--nnodes", "'3:2'"}},
      {{"--nnodes", "a", "t.py"}, {}, {"--nnodes", "'a'"}},
      {{"--nnodes", "1:0", "t.py"}, {}, {"--nnodes", "'1:0'"}},
      {{"--nnodes", "1:2:3", "t.py"}, {}, {"--nnodes", "'1:2:3'"}},
      {{"t.py"}, {{"PET_NNODES", "0"}}, {"--nnodes", "PET_NNODES", "'0'"}},
      {{"--nproc_per_node", "0", "t.py"}, {}, {"--nproc_per_node", "'0'", "cpu, gpu or auto"}},
      {{"--nproc-per-node", "x", "t.py"}, {}, {"--nproc_per_node", "'x'"}},
      {{"--nproc_per_node=-1", "t.py"}, {}, {"--nproc_per_node", "'-1'"}},
      {{"--node_rank=-1", "t.py"}, {}, {"--node_rank", "'-1'"}},
      {{"--nnodes", "2", "--node_rank", "2", "t.py"}, {}, {"--node_rank", "'2'", "0..1"}},
      {{"--master_port", "65536", "t.py"}, {}, {"--master_port", "'65536'", "0..65535"}},
      {{"--master_port", "abc", "t.py"}, {}, {"--master_port", "'abc'"}},
      {{"--master_port=-1", "t.py"}, {}, {"--master_port", "'-1'"}},
      {{"t.py"}, {{"PET_MASTER_PORT", "http"}}, {"--master_port", "PET_MASTER_PORT"}},
      {{"--master_addr", "host:80", "t.py"}, {}, {"--master_addr", "'host:80'", "--master_port"}},
      {{"--master_addr=", "t.py"}, {}, {"--master_addr"}},
      {{"--nnodes", "2", "--master_port", "0", "t.py"},
       {},
       {"port 0", "--master_port=0", "--nnodes=2", "fixed"}},
      {{"--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "h:0", "t.py"},
       {},
       {"port 0", "--rdzv_endpoint=h:0", "fixed"}},
      {{"--rdzv_backend", "c10d", "--rdzv_endpoint", "::::", "t.py"},
       {},
       {"--rdzv_endpoint", "'::::'", "IPv6"}},
      {{"--rdzv_conf", "store_type=file", "t.py"}, {}, {"--rdzv_conf", "store_type=tcp", "'file'"}},
      {{"--rdzv_conf", "join_timeout=abc", "t.py"}, {}, {"--rdzv_conf", "join_timeout", "'abc'"}},
      {{"--rdzv_conf", "join_timeout=0", "t.py"}, {}, {"--rdzv_conf", "positive"}},
      {{"--rdzv_conf", "join_timeout", "t.py"}, {}, {"--rdzv_conf", "KEY=VALUE"}},
      {{"--rdzv_conf", "is_host=maybe", "t.py"}, {}, {"--rdzv_conf", "is_host", "'maybe'"}},
      {{"--rdzv_conf", "failover=sometimes", "t.py"}, {}, {"--rdzv_conf", "failover", "'sometimes'"}},
      {{"--nnodes", "2", "--rdzv_endpoint", "a:1,b:1", "t.py"}, {}, {"--rdzv_endpoint", "'a:1,b:1'", "c10d"}},
      {{"--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "a:1,,b:1", "t.py"},
       {},
       {"--rdzv_endpoint", "empty entry"}},
      {{"--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "a:1,b:x", "t.py"},
       {},
       {"--rdzv_endpoint", "'b:x'"}},
      {{"--rdzv_backend", "etcd", "--rdzv_conf", "protocol=ftp", "t.py"},
       {},
       {"--rdzv_conf", "protocol=http or https", "'ftp'"}},
      {{"--rdzv_backend", "etcd", "--rdzv_conf", "protocol=https,cacert=/no/such/ca.pem", "t.py"},
       {},
       {"--rdzv_conf cacert=/no/such/ca.pem", "cannot read"}},
      {{"--rdzv_backend", "etcd-v2", "--rdzv_conf", "protocol=https,ssl_cert=/no/such/c.pem", "t.py"},
       {},
       {"--rdzv_conf ssl_cert=/no/such/c.pem", "cannot read"}},
      {{"--rdzv_backend", "etcd", "--rdzv_endpoint", "a:2379,b:x", "t.py"}, {}, {"--rdzv_endpoint", "'b:x'"}},
      {{"--rdzv_backend", "zookeeper", "t.py"}, {}, {"--rdzv_backend", "static, c10d, etcd, etcd-v2"}},
      {{"--rdzv_endpoint", "host", "t.py"}, {}, {"--rdzv_endpoint", "'host'", "port"}},
      {{"--rdzv_backend", "c10d", "--rdzv_endpoint", "h:x", "t.py"}, {}, {"--rdzv_endpoint", "'h:x'"}},
      {{"--rdzv_id=", "t.py"}, {}, {"--rdzv_id"}},
      {{"--redirects", "4", "t.py"}, {}, {"--redirects", "'4'", "0:1,1:2"}},
      {{"-r", "0:5", "t.py"}, {}, {"--redirects", "'0:5'"}},
      {{"-r", "a:1", "t.py"}, {}, {"--redirects", "'a:1'"}},
      {{"--tee", "x", "t.py"}, {}, {"--tee", "'x'"}},
      {{"-t", "1,2", "t.py"}, {}, {"--tee", "'1,2'"}},
      {{"--signals_to_handle", "SIGFOO", "t.py"}, {}, {"--signals_to_handle", "SIGFOO"}},
      {{"--signals_to_handle", "SIGTERM,SIGKILL", "t.py"}, {}, {"--signals_to_handle", "SIGKILL"}},
      {{"--signals_to_handle", "0", "t.py"}, {}, {"--signals_to_handle", "'0'"}},
      {{"--signals_to_handle", "SIGTERM,,SIGINT", "t.py"}, {}, {"--signals_to_handle"}},
      {{"--max_restarts", "-1", "t.py"}, {}, {"--max_restarts", "'-1'"}},
      {{"--health_check_timeout", "0", "t.py"}, {}, {"--health_check_timeout", "'0'", "above 0"}},
      {{"--health_check_attempts", "0", "t.py"}, {}, {"--health_check_attempts", "'0'"}},
      {{"--health_check_builtin", "yes", "t.py"}, {}, {"--health_check_builtin", "'yes'", "on"}},
      {{"--gpu_memory_wait", "-1", "t.py"}, {}, {"--gpu_memory_wait", "'-1'"}},
      {{"--metrics_port", "99999", "t.py"}, {}, {"--metrics_port", "'99999'"}},
      {{"--max_restarts", "1.5", "t.py"}, {}, {"--max_restarts", "'1.5'"}},
      {{"--monitor_interval", "-1", "t.py"}, {}, {"--monitor_interval", "'-1'"}},
      {{"--shutdown_timeout", "soon", "t.py"}, {}, {"--shutdown_timeout", "'soon'"}},
      // Beyond what a millisecond count holds once multiplied: refused, not wrapped.
      {{"--shutdown_timeout", "1e17", "t.py"}, {}, {"--shutdown_timeout", "'1e17'", "from 0 to 1000000000"}},
      {{"--hang_timeout", "1e300", "t.py"}, {}, {"--hang_timeout", "'1e300'"}},
      {{"--exit_barrier_timeout", "nan", "t.py"}, {}, {"--exit_barrier_timeout", "'nan'"}},
      {{"--store_memory_budget", "512K", "t.py"}, {}, {"--store_memory_budget", "'512K'", "at least"}},
      {{"--store_memory_budget", "1T", "t.py"}, {}, {"--store_memory_budget", "'1T'"}},
      {{"--store_memory_budget", "-1G", "t.py"}, {}, {"--store_memory_budget", "'-1G'"}},
      {{"--start_method", "thread", "t.py"}, {}, {"--start_method", "'thread'", "spawn"}},
      {{"--local_ranks_filter", "0,a", "t.py"}, {}, {"--local_ranks_filter", "'0,a'"}},
      {{"--log_level", "loud", "t.py"}, {}, {"--log_level", "'loud'"}},
      {{"--role=", "t.py"}, {}, {"--role"}},
      {{"--python=", "t.py"}, {}, {"--python"}},
      {{"--logs_specs", "mine", "t.py"}, {}, {"--logs_specs", "not supported"}},
      {{"--no_python", "-m", "t.py"}, {}, {"--no_python", "-m"}},
      {{"--standalone", "--nnodes", "2", "t.py"}, {}, {"--standalone", "--nnodes=2"}},
      {{"--bogus", "t.py"}, {}, {"--bogus"}},
      {{"-x", "t.py"}, {}, {"-x"}},
      {{"--nproc_per_node"}, {}, {"--nproc_per_node"}},
      {{}, {}, {"training script"}},
      {{"--nproc_per_node", "2"}, {}, {"training script"}},
      {{"t.py"}, {{"PET_STANDALONE", "on"}}, {"PET_STANDALONE"}},
  }));
  CAPTURE(join(row.args));
  auto o = parse(row.args, row.env, 1);
  INFO(o.result.message);
  CHECK(o.result.exit_code == 2);
  CHECK(o.result.should_exit);
  CHECK_THAT(o.result.message, Catch::StartsWith("ddprun: "));
  CHECK(o.result.message.find('\n') == std::string::npos);  // one message
  for (const auto& m : row.mentions) CHECK_THAT(o.result.message, Catch::Contains(m));
  CHECK(o.config.training_script.empty());  // out is left untouched on error
}
