// Unit tests of the command lines torchrun takes that ddprun used to refuse (launcher/launch_config.h):
// --rdzv_conf keys ddprun does not use (a warning names them), --nnodes MIN:MAX with the static backend (MAX
// nodes, as torchrun), and argparse's abbreviations, checked against the option strings of torchrun 2.6 and
// 1.13. Pure: no processes.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "launcher/flag_table.h"  // flags_starting_with
#include "launcher/launch_config.h"

namespace {

using namespace ddprun::launcher;
using Args = std::vector<std::string>;

ParseResult parse(const Args& args, LaunchConfig& c, const std::map<std::string, std::string>& env = {}) {
  Args argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  return parse_launch_config(
      argv, env, [] { return 0; }, c);
}

// argparse's verdict on `prefix` given a parser's "--" option strings: the option it means (an exact
// spelling, else the only one it begins), or "" (none, or ambiguous).
std::string argparse_match(const std::string& prefix, const Args& options) {
  std::string only;
  for (const auto& o : options) {
    if (o == prefix) return o;
    if (o.starts_with(prefix)) {
      if (!only.empty()) return "";
      only = o;
    }
  }
  return only;
}

// ddprun's canonical spelling of a torchrun option: underscores ("--nproc-per-node" -> "--nproc_per_node").
std::string canonical(std::string option) {
  for (size_t i = 2; i < option.size(); ++i) {
    if (option[i] == '-') option[i] = '_';
  }
  return option;
}

// ddprun's verdict: the flag's canonical spelling, "" when it refuses the prefix.
std::string ddprun_match(const std::string& prefix) {
  const auto matches = flags_starting_with(prefix, false);
  for (const auto& spellings : matches) {
    for (const auto& s : spellings) {
      if (s == prefix) return canonical(spellings.front());
    }
  }
  return matches.size() == 1 ? canonical(matches.front().front()) : "";
}

// `python -m torch.distributed.run`'s "--" option strings (get_args_parser()).
const Args kTorch26 = {"--help",
                       "--local-addr",
                       "--local-ranks-filter",
                       "--local_addr",
                       "--local_ranks_filter",
                       "--log-dir",
                       "--log_dir",
                       "--logs-specs",
                       "--logs_specs",
                       "--master-addr",
                       "--master-port",
                       "--master_addr",
                       "--master_port",
                       "--max-restarts",
                       "--max_restarts",
                       "--module",
                       "--monitor-interval",
                       "--monitor_interval",
                       "--nnodes",
                       "--no-python",
                       "--no_python",
                       "--node-rank",
                       "--node_rank",
                       "--nproc-per-node",
                       "--nproc_per_node",
                       "--rdzv-backend",
                       "--rdzv-conf",
                       "--rdzv-endpoint",
                       "--rdzv-id",
                       "--rdzv_backend",
                       "--rdzv_conf",
                       "--rdzv_endpoint",
                       "--rdzv_id",
                       "--redirects",
                       "--role",
                       "--run-path",
                       "--run_path",
                       "--standalone",
                       "--start-method",
                       "--start_method",
                       "--tee"};
const Args kTorch113 = {"--help",         "--log_dir",       "--master_addr",      "--master_port",
                        "--max_restarts", "--module",        "--monitor_interval", "--nnodes",
                        "--no_python",    "--node_rank",     "--nproc_per_node",   "--rdzv_backend",
                        "--rdzv_conf",    "--rdzv_endpoint", "--rdzv_id",          "--redirects",
                        "--role",         "--run_path",      "--standalone",       "--start_method",
                        "--tee"};

}  // namespace

TEST_CASE("torch compat: --rdzv_conf keys ddprun does not use are ignored with a warning naming them",
          "[launcher][torch_compat]") {
  LaunchConfig c;
  auto r =
      parse({"--rdzv_backend", "c10d", "--rdzv_conf", "use_libuv=0,join_timeout=7,foo=bar baz", "t.py"}, c);
  CHECK(r.exit_code == 0);
  CHECK_FALSE(r.should_exit);
  CHECK(r.message ==
        "ddprun: warning: --rdzv_conf: ignoring foo=bar baz, use_libuv=0 (not a key ddprun uses)\n");
  CHECK(c.rdzv_timings.join_timeout == 7);
  // store_type=tcp is what ddprun's store is: no warning (PET_RDZV_CONF, as a PyTorchJob sets it).
  r = parse({"t.py"}, c, {{"PET_RDZV_CONF", "store_type=TCP"}});
  CHECK(r.exit_code == 0);
  CHECK(r.message.empty());
  r = parse({"--rdzv_conf", "store_type=file", "t.py"}, c);
  CHECK(r.exit_code == 2);
}

TEST_CASE("torch compat: --nnodes MIN:MAX with the static backend runs MAX nodes, as torchrun",
          "[launcher][torch_compat]") {
  LaunchConfig c;
  auto r = parse({"--nnodes", "1:3", "--node_rank", "2", "--master_addr", "m", "t.py"}, c);
  CHECK(r.exit_code == 0);
  CHECK((c.min_nodes == 3 && c.max_nodes == 3 && c.node_rank == 2));
  CHECK(
      r.message ==
      "ddprun: warning: --nnodes=1:3 with the static backend runs 3 nodes, as torchrun does (a node range is "
      "elastic with --rdzv_backend=c10d)\n");
  r = parse({"--nnodes", "1:3", "--node_rank", "3", "t.py"}, c);
  CHECK(r.exit_code == 2);  // node ranks 0..2
}

TEST_CASE("torch compat: argparse abbreviations", "[launcher][torch_compat]") {
  LaunchConfig c;
  SECTION("a prefix of one flag is that flag, with = or a separate value") {
    auto r = parse({"--nproc_per=3", "--max_r", "2", "--stand", "t.py", "--nproc_per=9"}, c);
    CHECK(r.exit_code == 0);
    CHECK(c.nproc_per_node == 3);
    CHECK(c.max_restarts == 2);
    CHECK(c.rdzv_kind == RendezvousKind::kStandalone);
    CHECK(c.training_script_args == Args{"--nproc_per=9"});  // the script's own arguments are its own
  }
  SECTION("a prefix of both spellings of one flag is that flag (torch 1.13 takes --nproc)") {
    CHECK(parse({"--nproc", "4", "t.py"}, c).exit_code == 0);
    CHECK(c.nproc_per_node == 4);
  }
  SECTION("a prefix of several flags is ambiguous, as argparse says") {
    auto r = parse({"--rdzv_i", "x", "--no", "t.py"}, c);
    CHECK(r.exit_code == 2);
    CHECK(r.message ==
          "ddprun: ambiguous option: --no could match --no_python, --no-python, --node_rank, --node-rank, "
          "--no_slurm, --no-slurm (see ddprun --help)");
  }
}

TEST_CASE("torch compat: every abbreviation torchrun 2.6 or 1.13 takes means the same flag under ddprun",
          "[launcher][torch_compat]") {
  // Where ddprun's own flags (--hang_timeout, --health_check, --log_level, --no_slurm,
  // --max_no_progress_restarts) or torch 2.x's (--local_addr, for 1.13's --l) share the prefix, argparse's
  // rule makes it ambiguous: these, and only these, are refused.
  const std::set<std::string> ddprun_extensions = {"--h",    "--he",  "--l",   "--lo",  "--log",  "--log-",
                                                   "--log_", "--no-", "--no_", "--max", "--max-", "--max_"};
  for (const Args* torch : {&kTorch26, &kTorch113}) {
    for (const std::string& option : *torch) {
      for (size_t n = 3; n <= option.size(); ++n) {
        const std::string prefix = option.substr(0, n);
        const std::string theirs = argparse_match(prefix, *torch);
        if (theirs.empty()) continue;
        CAPTURE(prefix, theirs);
        if (ddprun_extensions.count(prefix)) {
          CHECK(ddprun_match(prefix).empty());
        } else {
          CHECK(ddprun_match(prefix) == canonical(theirs));
        }
      }
    }
  }
}
