// Unit tests of the ddprun command line: launcher/launch_config.h. Pure: no processes.
#include "launcher/launch_config.h"

#include <csignal>
#include <sstream>
#include <thread>

#include "catch_compat.h"

namespace {

using namespace ddprun::launcher;
using Env = std::map<std::string, std::string>;
using Args = std::vector<std::string>;

struct Outcome {
  ParseResult result;
  LaunchConfig config;
  int gpu_calls = 0;
};

Outcome parse(const Args& args, const Env& env = {}, int gpus = 0) {
  Args argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  Outcome o;
  o.result = parse_launch_config(
      argv, env,
      [&] {
        ++o.gpu_calls;
        return gpus;
      },
      o.config);
  return o;
}

std::string join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string describe(const StdSpec& s) {
  if (s.per_rank.empty()) return std::to_string(static_cast<int>(s.all));
  std::vector<std::string> parts;
  for (const auto& [rank, std] : s.per_rank)
    parts.push_back(std::to_string(rank) + ":" + std::to_string(int(std)));
  return join(parts, ",");
}

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
      {{"--python"}, "", {}, "/usr/bin/python3", [](C c) { return c.python; }, "/usr/bin/python3"},
      {{"--log_level", "--log-level"}, "", {}, "debug", [](C c) { return c.log_level; }, "debug"},
      {{"--log_level", "--log-level"}, "", {}, "warning", [](C c) { return c.log_level; }, "warn"},
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
  CHECK(c.python == "python3");
  CHECK(c.log_level == "info");
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
  CHECK(none.result.message == "ddprun: --nproc_per_node=gpu but no CUDA device is visible");
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
      {{"--nnodes", "1:2", "t.py"}, {}, {"--nnodes=1:2", "c10d"}},
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
      {{"--rdzv_conf", "bogus=1", "t.py"},
       {},
       {"--rdzv_conf", "bogus", "join_timeout", "keep_alive_max_attempt"}},
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
      {{"--rdzv_backend", "etcd", "t.py"}, {}, {"--rdzv_backend", "not supported by ddprun; use c10d"}},
      {{"--rdzv_backend", "etcd-v2", "t.py"}, {}, {"--rdzv_backend", "use c10d"}},
      {{"--rdzv_backend", "zookeeper", "t.py"}, {}, {"--rdzv_backend", "static, c10d"}},
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
      {{"--max_restarts", "1.5", "t.py"}, {}, {"--max_restarts", "'1.5'"}},
      {{"--monitor_interval", "-1", "t.py"}, {}, {"--monitor_interval", "'-1'"}},
      {{"--shutdown_timeout", "soon", "t.py"}, {}, {"--shutdown_timeout", "'soon'"}},
      {{"--exit_barrier_timeout", "nan", "t.py"}, {}, {"--exit_barrier_timeout", "'nan'"}},
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
          "dynamic_rendezvous");
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
