// Unit tests of --dry-run (launcher/dry_run.h) and of the agent configuration it shares with a launch
// (launcher/agent_config.h). Pure: no processes, no files.
#include "launcher/dry_run.h"

#include <map>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "launcher/agent_config.h"
#include "launcher/launch_config.h"

namespace {

using namespace ddprun::launcher;
using Args = std::vector<std::string>;

LaunchConfig parse(const Args& args, const std::map<std::string, std::string>& env = {}) {
  Args argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  LaunchConfig c;
  const auto no_gpu = [] { return 0; };
  auto r = parse_launch_config(argv, env, no_gpu, c);
  INFO(r.message);
  REQUIRE_FALSE(r.should_exit);
  return c;
}

LauncherContext context() {
  return {.env = {{"PATH", "/usr/bin"}, {"HOME", "/root"}}, .temp_dir = "/tmp/x"};
}

std::string plan_text(const Args& args) {
  return dry_run(parse(args), context());
}

// The lines of the block of worker `local_rank`, from "worker local_rank N" up to the next block.
std::string worker_block(const std::string& text, int local_rank) {
  const std::string head = "worker local_rank " + std::to_string(local_rank) + " ";
  auto start = text.find(head);
  REQUIRE(start != std::string::npos);
  auto end = text.find("worker local_rank ", start + head.size());
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

TEST_CASE("dry run: one static node, every value known, the run directory in the error file",
          "[launcher][dry_run]") {
  const std::string text =
      plan_text({"--nproc_per_node", "2", "--log_dir", "/l", "--dry-run", "t.py", "--msg", "hello world"});
  INFO(text);
  CHECK_THAT(text, Catch::StartsWith("ddprun dry run: nothing was started\n"));
  CHECK_THAT(text, Catch::Contains(
                       "  rendezvous: static, store 127.0.0.1:29500 on node 0 (this node), run id none\n"));
  CHECK_THAT(text, Catch::Contains("  nodes:      node_rank 0 of 1 (--nnodes 1), world size 2\n"));
  CHECK_THAT(text, Catch::Contains("SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2 forwarded"));
  CHECK_THAT(text, Catch::Contains("  logs:       /l/none_XXXXXXXX (the X's: random, chosen at start)\n"));
  CHECK(worker_block(text, 1) ==
        "worker local_rank 1 (rank 1):\n"
        "  argv: python3 -u t.py --msg 'hello world'\n"
        "  stdout: console\n"
        "  stderr: console\n"
        "  env:\n"
        "    DDPRUN_PROGRESS_FILE=/l/none_XXXXXXXX/attempt_0/1/progress\n"
        "    GROUP_RANK=0\n    GROUP_WORLD_SIZE=1\n    LOCAL_RANK=1\n    LOCAL_WORLD_SIZE=2\n"
        "    MASTER_ADDR=127.0.0.1\n    MASTER_PORT=29500\n"
        "    OMP_NUM_THREADS=1\n    RANK=1\n    ROLE_NAME=default\n    ROLE_RANK=1\n    ROLE_WORLD_SIZE=2\n"
        "    TORCHELASTIC_ERROR_FILE=/l/none_XXXXXXXX/attempt_0/1/error.json\n"
        "    TORCHELASTIC_MAX_RESTARTS=0\n    TORCHELASTIC_RESTART_COUNT=0\n    TORCHELASTIC_RUN_ID=none\n"
        "    TORCHELASTIC_USE_AGENT_STORE=True\n    TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n    WORLD_SIZE=2\n");
  CHECK(text.find("PATH=") == std::string::npos);
  CHECK(text.find("HOME=") == std::string::npos);
}

TEST_CASE("dry run: without --log_dir the agent's temporary directory", "[launcher][dry_run]") {
  const std::string text = plan_text({"--rdzv_id", "j1", "t.py"});
  INFO(text);
  CHECK_THAT(text, Catch::Contains("  logs:       /tmp/x/ddprun-j1-XXXXXX (temporary, removed when the job "
                                   "succeeds; --log_dir keeps it)\n"));
  CHECK_THAT(text,
             Catch::Contains("TORCHELASTIC_ERROR_FILE=/tmp/x/ddprun-j1-XXXXXX/attempt_0/0/error.json\n"));
  // -r without --log_dir: log files in <temp dir>/<run id>_XXXXXXXX (LogLayout::create).
  CHECK_THAT(plan_text({"-r", "1", "t.py"}),
             Catch::Contains("stdout: file /tmp/x/none_XXXXXXXX/attempt_0/0/stdout.log\n"));
}

TEST_CASE("dry run: stdout and stderr routing comes from the worker launches", "[launcher][dry_run]") {
  SECTION("-r1 -t1: tee wins, the console gets the lines with a prefix") {
    const std::string text = plan_text({"-r", "1", "-t", "1", "--log_dir", "/l", "t.py"});
    INFO(text);
    CHECK_THAT(text, Catch::Contains("  stdout: console (prefix [default0]:) + file "
                                     "/l/none_XXXXXXXX/attempt_0/0/stdout.log\n"));
  }
  SECTION("redirects and a filter, per rank") {
    const std::string text = plan_text({"--nproc_per_node", "2", "-r", "0:1", "-t", "1:2",
                                        "--local_ranks_filter", "0", "--log_dir", "/l", "t.py"});
    INFO(text);
    CHECK_THAT(worker_block(text, 0),
               Catch::Contains("  stdout: file /l/none_XXXXXXXX/attempt_0/0/stdout.log\n"
                               "  stderr: console\n"));  // not tee'd: no prefix, no stderr.log (torchrun's)
    CHECK_THAT(worker_block(text, 1),
               Catch::Contains("  stdout: discarded (--local_ranks_filter)\n"
                               "  stderr: file /l/none_XXXXXXXX/attempt_0/1/stderr.log\n"));
  }
}

TEST_CASE("dry run: c10d leaves ranks, world size and the workers' store to the rendezvous",
          "[launcher][dry_run]") {
  const std::string text = plan_text({"--nnodes", "1:4", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                                      "10.0.0.1", "--nproc_per_node", "2", "-t", "3", "t.py"});
  INFO(text);
  CHECK_THAT(text, Catch::Contains("  rendezvous: c10d, endpoint 10.0.0.1:29400; the workers' store "
                                   "(MASTER_ADDR, MASTER_PORT) is decided at the rendezvous, run id none\n"));
  CHECK_THAT(text,
             Catch::Contains("  timeouts:   join 600 s, last call 30 s, close 30 s, heartbeat every 5 s "
                             "(3 missed: node lost), store reads 60 s\n"));
  CHECK_THAT(text,
             Catch::Contains("  nodes:      1 to 4 (--nnodes 1:4); node rank, global ranks and world size "
                             "decided at the rendezvous\n"));
  CHECK_THAT(text, Catch::Contains("worker local_rank 1 (rank decided at the rendezvous):\n"));
  CHECK_THAT(text, Catch::Contains("  stdout: console (prefix [default1]:) + file"));  // torch's, no node tag
  for (const char* name : {"RANK", "ROLE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "WORLD_SIZE",
                           "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    CHECK_THAT(text, Catch::Contains(std::string("\n    ") + name + "=<decided at the rendezvous>\n"));
  }
  CHECK_THAT(text, Catch::Contains("    LOCAL_WORLD_SIZE=2\n"));
}

TEST_CASE("dry run: etcd backends name the members; the workers host their own store",
          "[launcher][dry_run]") {
  const std::string text = plan_text({"--nnodes", "2:4", "--rdzv_backend", "etcd", "--rdzv_endpoint",
                                      "e1,e2:2380", "--rdzv_conf", "protocol=https,etcd_prefix=/p", "t.py"});
  INFO(text);
  CHECK_THAT(text, Catch::Contains(
                       "  rendezvous: etcd (torch's protocol, keys under /p), etcd https://e1:2379,e2:2380; "
                       "the workers' store (MASTER_ADDR, MASTER_PORT): a free port of node 0, decided at "
                       "the rendezvous, run id none\n"));
  CHECK_THAT(text, Catch::Contains("    TORCHELASTIC_USE_AGENT_STORE=False\n"));
  CHECK_THAT(text, Catch::Contains("\n    MASTER_PORT=<decided at the rendezvous>\n"));
  const std::string v2 = plan_text({"--nnodes", "2", "--rdzv_backend", "etcd-v2", "t.py"});
  INFO(v2);
  CHECK_THAT(v2, Catch::Contains("  rendezvous: etcd-v2 (ddprun's dynamic rendezvous on etcd), etcd "
                                 "http://localhost:2379;"));
  CHECK_THAT(v2, Catch::Contains("    TORCHELASTIC_USE_AGENT_STORE=False\n"));
  CHECK_THAT(v2, Catch::Contains("heartbeat every 5 s"));
}

TEST_CASE("dry run: static node 1 of 2 knows its group but not the other node's workers",
          "[launcher][dry_run]") {
  const std::string text = plan_text(
      {"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2", "--master_addr", "10.0.0.1", "t.py"});
  INFO(text);
  CHECK_THAT(text, Catch::Contains("store 10.0.0.1:29500 on node 0, run id"));
  CHECK_THAT(text, Catch::Contains("node_rank 1 of 2 (--nnodes 2), world size decided at the rendezvous "
                                   "(4 if every node runs 2 workers)\n"));
  CHECK_THAT(text, Catch::Contains("worker local_rank 0 (rank decided at the rendezvous):\n"));
  CHECK_THAT(text, Catch::Contains("  stdout: console\n"));  // as torchrun: no prefix without --tee
  CHECK_THAT(text, Catch::Contains("    GROUP_RANK=1\n    GROUP_WORLD_SIZE=2\n"));
  CHECK_THAT(text, Catch::Contains("    MASTER_ADDR=10.0.0.1\n    MASTER_PORT=29500\n"));
  CHECK_THAT(text, Catch::Contains("    WORLD_SIZE=<decided at the rendezvous>\n"));
  // Node 0's ranks start at 0 whatever the other nodes run.
  CHECK_THAT(plan_text({"--nnodes", "2", "--nproc_per_node", "2", "t.py"}),
             Catch::Contains("worker local_rank 1 (rank 1):\n"));
}

TEST_CASE("dry run: standalone's store port is chosen when it binds", "[launcher][dry_run]") {
  const std::string text = plan_text({"--standalone", "--node_rank", "3", "t.py"});
  INFO(text);
  CHECK_THAT(text, Catch::Contains("  rendezvous: c10d (standalone), store 127.0.0.1:<chosen when the store "
                                   "binds> on this node, run id none\n"));
  CHECK_THAT(text, Catch::Contains("    GROUP_RANK=0\n"));
  // The store listens on 127.0.0.1; the workers get torchrun's MASTER_ADDR (its endpoint is localhost:0).
  CHECK_THAT(text,
             Catch::Contains("    MASTER_ADDR=localhost\n    MASTER_PORT=<chosen when the store binds>\n"));
  LaunchConfig c = parse({"--standalone", "t.py"});
  CHECK(c.random_run_id);  // torchrun's uuid4, made by the launcher at start
  CHECK_FALSE(parse({"--standalone", "--rdzv_id", "mine", "t.py"}).random_run_id);
  CHECK_FALSE(parse({"t.py"}).random_run_id);
}

TEST_CASE("dry run: hang detection adds its variables under the run directory", "[launcher][dry_run]") {
  const std::string text = plan_text({"--hang_timeout", "60", "--log_dir", "/l", "t.py"});
  INFO(text);
  CHECK_THAT(text, Catch::Contains("    DDPRUN_PROGRESS_FILE=/l/none_XXXXXXXX/attempt_0/0/progress\n"));
  CHECK_THAT(text, Catch::Contains("    TORCH_NCCL_DUMP_ON_TIMEOUT=1\n"));
}

TEST_CASE("agent config: node tags, log directory and omp threads", "[launcher][dry_run]") {
  CHECK(host_and_pid("node7.cluster.org", "12") == "node7:12");
  CHECK(host_and_pid("node7", "12") == "node7:12");
  CHECK(node_tag(parse({"t.py"}), "h:1").empty());
  CHECK(node_tag(parse({"--standalone", "t.py"}), "h:1").empty());
  CHECK(node_tag(parse({"--nnodes", "3", "--node_rank", "2", "t.py"}), "h:1") == "n2");
  CHECK(node_tag(parse({"--rdzv_backend", "c10d", "t.py"}), "h:1") == "h:1");

  auto a = agent_config(parse({"--nproc_per_node", "2", "-t", "1", "t.py"}), context());
  CHECK(a.log_dir == "/tmp/x");  // -t asks for files: the temporary directory
  CHECK(a.set_omp_threads);
  CHECK(a.workers.size() == 2);
  CHECK(a.workers[1].argv == Args{"python3", "-u", "t.py"});
  CHECK(a.workers[1].output.stdout_to_file);
  CHECK(a.workers[1].output.stdout_to_console);
  CHECK(a.workers[1].output.prefix_stdout);
  CHECK_FALSE(a.workers[1].output.prefix_stderr);  // torch prefixes the tee'd streams only
  CHECK_FALSE(a.workers[1].output.stderr_to_file);
  CHECK(agent_config(parse({"t.py"}), context()).log_dir.empty());
  LauncherContext omp = context();
  omp.env["OMP_NUM_THREADS"] = "4";
  CHECK_FALSE(agent_config(parse({"--nproc_per_node", "2", "t.py"}), omp).set_omp_threads);
}

TEST_CASE("dry run helpers: env filter and shell quoting", "[launcher][dry_run]") {
  auto [name, shown] = GENERATE(table<std::string, bool>({{"RANK", true},
                                                          {"LOCAL_WORLD_SIZE", true},
                                                          {"TORCHELASTIC_RUN_ID", true},
                                                          {"TORCH_NCCL_ASYNC_ERROR_HANDLING", true},
                                                          {"DDPRUN_X", true},
                                                          {"NCCL_DEBUG", true},
                                                          {"CUDA_VISIBLE_DEVICES", true},
                                                          {"PATH", false},
                                                          {"RANKS", false},
                                                          {"MY_RANK", false},
                                                          {"TORCH_HOME", false},
                                                          {"", false}}));
  CAPTURE(name);
  CHECK(is_plan_env_var(name) == shown);

  auto [arg, quoted] = GENERATE(table<std::string, std::string>({{"plain", "plain"},
                                                                 {"--lr=0.1", "--lr=0.1"},
                                                                 {"a b", "'a b'"},
                                                                 {"", "''"},
                                                                 {"it's", "'it'\\''s'"},
                                                                 {"$HOME", "'$HOME'"},
                                                                 {"/p/x.py", "/p/x.py"}}));
  CAPTURE(arg);
  CHECK(shell_quote(arg) == quoted);
}
