#include "launcher/launch_config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <tuple>

#include "agent/worker_env.h"  // virtual_device
#include "launcher/flag_table.h"
#include "launcher/flag_values.h"
#include "launcher/operation_flags.h"
#include "launcher/slurm/slurm_env.h"
#include "launcher/slurm/slurm_launch.h"
#include "launcher/version.h"
#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {
namespace {

using Env = std::map<std::string, std::string>;

// CLI11's App, with access to how each left-over argument was classified (unknown option vs positional).
class ArgApp : public CLI::App {
 public:
  using CLI::App::App;
  const missing_t& missing() const { return missing_; }
};

// CLI11's usage line knows nothing of the script: say it.
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string name) const override {
    return "Usage: " + name + " [OPTIONS] training_script [training_script_args...]\n";
  }
};

class Parser {
 public:
  Parser(const Env& env, std::function<int()> gpu_count, std::function<NumaMachine()> numa_machine,
         bool launch_mode)
      : env_(env),
        gpu_count_(std::move(gpu_count)),
        numa_machine_(std::move(numa_machine)),
        launch_mode_(launch_mode) {
    app_.formatter(std::make_shared<UsageFormatter>());
    app_.description(
        "ddprun: a drop-in replacement for torchrun.\n"
        "Every torchrun flag takes both spellings (--nproc_per_node, --nproc-per-node) and is also\n"
        "read from PET_<NAME> (PET_NPROC_PER_NODE) when absent. Arguments after the script are its own.");
    app_.prefix_command();
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    for (const FlagSpec& f : flag_table()) {
      if (!f.launch_only || launch_mode_) add(f);
    }
  }

  ParseResult run(const std::vector<std::string>& argv, LaunchConfig& c) {
    std::vector<std::string> args =
        split_empty_values({argv.size() > 1 ? argv.begin() + 1 : argv.end(), argv.end()});
    std::reverse(args.begin(), args.end());
    try {
      app_.parse(args);
    } catch (const CLI::CallForHelp&) {
      return {0, true, app_.help()};
    } catch (const CLI::ParseError& e) {
      throw UsageError(std::string("ddprun: ") + e.what() + " (see ddprun --help)");
    }
    if (flag_value("--version")) return {0, true, version_text("ddprun") + "\n"};
    script(c);
    convert(c);
    std::string msg;
    for (const auto& w : warnings_) msg += "ddprun: warning: " + w + "\n";
    return {0, false, msg};
  }

 private:
  struct Opt {
    std::string flag;  // canonical (first) spelling
    std::string env;   // PET_ name, or "" when the flag has none
    CLI::Option* cli = nullptr;
    std::string value;
    std::string default_text;
  };

  void add(const FlagSpec& f) {
    Opt& o = opts_[canonical_flag(f.names)];
    o.flag = canonical_flag(f.names);
    o.env = *f.pet ? std::string("PET_") + f.pet : "";
    if (f.kind == FlagSpec::Kind::kSwitch) {
      o.cli = app_.add_flag(f.names)->description(f.help + (o.env.empty() ? "" : " [env " + o.env + "=1]"));
      return;
    }
    o.default_text = f.default_text;
    o.cli = app_.add_option(f.names, o.value, f.help + (o.env.empty() ? "" : " [env " + o.env + "]"));
    if (!o.default_text.empty()) o.cli->default_str(o.default_text);
  }

  // CLI11 2.1 reads "--flag=" (empty value) like "--flag" and takes the next argument as the value; argparse
  // gives an empty string. Before the script, rewrite "--flag=" to "--flag" "" for options that take a value.
  std::vector<std::string> split_empty_values(const std::vector<std::string>& in) const {
    std::vector<std::string> out;
    size_t i = 0;
    for (; i < in.size() && in[i] != "--" && in[i].size() >= 2 && in[i][0] == '-'; ++i) {
      const std::string a = unabbreviated(in[i]);
      auto eq = a.find('=');
      std::string name = a.substr(0, eq);
      const CLI::Option* opt = app_.get_option_no_throw(name);
      if (opt == nullptr || opt->get_items_expected_max() == 0) {  // unknown (an error later) or a flag
        out.push_back(a);
      } else if (eq == a.size() - 1 && name.rfind("--", 0) == 0) {
        out.insert(out.end(), {name, ""});
      } else if (eq == std::string::npos && i + 1 < in.size()) {
        out.insert(out.end(), {a, in[i + 1]});  // "--flag value" or "-r value"
        ++i;
      } else {
        out.push_back(a);
      }
    }
    out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(i), in.end());
    return out;
  }

  // argparse's abbreviations, as torchrun takes them: "--nproc_per=4" is "--nproc_per_node=4" when no other
  // flag has a spelling that starts with "--nproc_per" (ddprun also takes "--nproc", whose two matches are
  // spellings of one flag: torch 1.13 takes it, torch 2.x calls it ambiguous). Several flags: an error that
  // names every match, as argparse's.
  std::string unabbreviated(const std::string& a) const {
    const auto eq = a.find('=');
    const std::string name = a.substr(0, eq);
    if (!name.starts_with("--") || name.size() < 3 || app_.get_option_no_throw(name) != nullptr) return a;
    const auto matches = flags_starting_with(name, launch_mode_);
    if (matches.size() == 1) return matches.front().front() + (eq == std::string::npos ? "" : a.substr(eq));
    if (matches.size() > 1) {
      std::string all;
      for (const auto& spellings : matches) {
        for (const auto& spelling : spellings) all += (all.empty() ? "" : ", ") + spelling;
      }
      throw UsageError("ddprun: ambiguous option: " + name + " could match " + all + " (see ddprun --help)");
    }
    return a;
  }

  // The value from the command line, else from the PET_ variable (empty = unset), else nullopt.
  std::optional<Given> given(const std::string& flag) const {
    const Opt& o = opts_.at(flag);
    if (o.cli->count() > 0) return Given{o.flag, o.value, ""};
    if (!o.env.empty()) {
      auto it = env_.find(o.env);
      if (it != env_.end() && !it->second.empty()) return Given{o.flag, it->second, o.env};
    }
    return std::nullopt;
  }
  // The value given, else the one derived from Slurm, else the default.
  Given get(const std::string& flag) const {
    if (auto g = given(flag)) return *g;
    if (auto it = slurm_defaults_.find(flag); it != slurm_defaults_.end()) return it->second;
    return Given{flag, opts_.at(flag).default_text, ""};
  }
  // Flags: present on the command line, or PET_<NAME> is a non-zero integer (torchrun's check_env).
  bool flag_value(const std::string& flag) const {
    const Opt& o = opts_.at(flag);
    if (o.cli->count() > 0) return true;
    auto g = given(flag);
    if (!g) return false;
    auto v = to_int(g->text);
    if (!v) fail(*g, "0 or 1");
    return *v != 0;
  }

  void script(LaunchConfig& c) {
    auto missing = app_.missing();
    if (!missing.empty() && missing.front().first == CLI::detail::Classifier::POSITIONAL_MARK) {
      missing.erase(missing.begin());  // "ddprun [OPTIONS] -- script ...": the marker is not the script
    }
    if (missing.empty()) {
      throw UsageError(
          "ddprun: missing the training script (usage: ddprun [OPTIONS] training_script [args...])");
    }
    if (missing.front().first != CLI::detail::Classifier::NONE) {
      throw UsageError("ddprun: unrecognized option '" + missing.front().second + "' (see ddprun --help)");
    }
    c.training_script = missing.front().second;
    c.training_script_args.clear();
    for (size_t i = 1; i < missing.size(); ++i) c.training_script_args.push_back(missing[i].second);
  }

  void nnodes(LaunchConfig& c) { std::tie(c.min_nodes, c.max_nodes) = parse_nnodes(get("--nnodes")); }

  void nproc(LaunchConfig& c) {
    Given g = get("--nproc_per_node");
    c.nproc_spec = trim(g.text);
    auto gpus = [&] {
      try {
        return gpu_count_ ? gpu_count_() : count_gpu_devices();
      } catch (const std::invalid_argument& e) {  // torch refuses these *_VISIBLE_DEVICES
        throw UsageError("ddprun: --nproc_per_node=" + c.nproc_spec + ": " + e.what());
      }
    };
    c.nproc_per_node = parse_nproc_per_node(g, gpus);
  }

  // The backend: --rdzv_backend, judged even when --standalone ignores it, and --standalone.
  void backend(LaunchConfig& c) {
    Given backend = get("--rdzv_backend");
    const std::string kind = one_of(backend, {"static", "c10d", "etcd", "etcd-v2"});
    c.rdzv_kind = kind == "c10d"      ? RendezvousKind::kC10d
                  : kind == "etcd"    ? RendezvousKind::kEtcd
                  : kind == "etcd-v2" ? RendezvousKind::kEtcdV2
                                      : RendezvousKind::kStatic;
    if (!flag_value("--standalone")) return;
    for (const char* f : {"--rdzv_backend", "--rdzv_endpoint"}) {
      if (auto g = given(f)) warnings_.push_back(std::string("--standalone ignores ") + f + "=" + g->text);
    }
    c.rdzv_kind = RendezvousKind::kStandalone;
  }

  // Where and how the agents meet: the run id, --rdzv_conf, the endpoint (c10d's, or static's at
  // --master_addr:--master_port unless --rdzv_endpoint gives it), and this node's rank.
  void rendezvous(LaunchConfig& c) {
    Given id = get("--rdzv_id");
    if (id.text.empty()) fail(id, "a non-empty id");
    c.rdzv_id = id.text;
    rdzv_conf(c);
    if (c.rdzv_kind == RendezvousKind::kStandalone) {
      // torchrun: rdzv_id = str(uuid.uuid4()), even over a given --rdzv_id; ddprun keeps one given.
      c.random_run_id = !given("--rdzv_id");
      if (c.min_nodes != 1 || c.max_nodes != 1) {
        throw UsageError("ddprun: --standalone runs one node; it cannot be used with --nnodes=" +
                         get("--nnodes").text);
      }
      c.rdzv_endpoint = rdzv::Endpoint{"127.0.0.1", 0};
      return node_rank(c);
    }
    const bool c10d = c.rdzv_kind == RendezvousKind::kC10d, etcd = etcd_kind(c.rdzv_kind);
    const uint16_t default_port = etcd ? 2379 : 29400;
    auto endpoints = parse_rdzv_endpoint(get("--rdzv_endpoint"), c10d || etcd, default_port);
    if (!endpoints.empty()) {
      endpoint_ = endpoints.front();
      c.rdzv_fallbacks.assign(endpoints.begin() + 1, endpoints.end());
    }
    if (c10d || etcd) c.rdzv_endpoint = endpoint_.value_or(rdzv::Endpoint{"localhost", default_port});
    if (!elastic_kind(c.rdzv_kind) &&
        c.min_nodes != c.max_nodes) {  // torchrun's static backend runs MAX nodes, silently
      warnings_.push_back("--nnodes=" + get("--nnodes").text + " with the static backend runs " +
                          std::to_string(c.max_nodes) +
                          " nodes, as torchrun does (a node range is elastic with --rdzv_backend=c10d)");
      c.min_nodes = c.max_nodes;
    }
    node_rank(c);
  }

  void rdzv_conf(LaunchConfig& c) {
    const auto conf = parse_rdzv_conf(get("--rdzv_conf"));
    std::string unused;
    for (const auto& [key, value] : conf) {
      if (!is_rdzv_conf_key(key)) unused += (unused.empty() ? "" : ", ") + key + "=" + value;
    }
    if (!unused.empty()) warnings_.push_back("--rdzv_conf: ignoring " + unused + " (not a key ddprun uses)");
    c.rdzv_timings = rdzv_timings(conf);
    if (auto it = conf.find("is_host"); it != conf.end()) c.is_host = it->second == "true";
    if (auto it = conf.find("failover"); it != conf.end()) c.store_failover = it->second == "true";
    if (etcd_kind(c.rdzv_kind)) c.etcd = etcd_conf(conf, c.rdzv_kind == RendezvousKind::kEtcd, warnings_);
  }

  // --master_addr, --master_port and --node_rank: read by every backend (a bad value is an error), used by
  // the static one only (c10d and standalone ignore them, as torchrun does).
  void node_rank(LaunchConfig& c) {
    const std::string master_addr = parse_master_addr(get("--master_addr"));
    const uint16_t master_port = parse_master_port(get("--master_port"));
    master_port_given_ = given("--master_port").has_value();
    Given rank = get("--node_rank");
    c.node_rank = int_at_least(rank, 0);
    if (c.rdzv_kind != RendezvousKind::kStatic) return;
    if (c.node_rank >= c.max_nodes) {
      fail(rank, "a node rank in 0.." + std::to_string(c.max_nodes - 1) +
                     " (--nnodes=" + get("--nnodes").text + ")");
    }
    c.rdzv_endpoint = endpoint_.value_or(rdzv::Endpoint{master_addr, master_port});
  }

  // ddprun-launch without --use_env: the script gets "--local-rank=N" (or the underscored spelling).
  void local_rank_arg(LaunchConfig& c) {
    if (!launch_mode_ || flag_value("--use_env")) return;
    if (c.no_python && !c.run_path) {
      throw UsageError(
          "ddprun-launch: --no_python needs --use_env (as in torch.distributed.launch): a program "
          "is not given --local-rank");
    }
    const std::string style = one_of(get("--local_rank_style"), {"auto", "dash", "underscore"});
    c.local_rank_arg = style == "dash" ? "--local-rank" : style == "underscore" ? "--local_rank" : "auto";
  }

  void launch(LaunchConfig& c) {
    c.max_restarts = int_at_least(get("--max_restarts"), 0);
    c.max_no_progress_restarts = int_at_least(get("--max_no_progress_restarts"), 0);
    parse_operation_flags([this](const std::string& flag) { return get(flag); }, c);
    c.monitor_interval = seconds(get("--monitor_interval"));
    c.start_method = one_of(get("--start_method"), {"spawn", "fork", "forkserver"});
    Given role = get("--role");
    if (role.text.empty()) fail(role, "a non-empty role name");
    c.role = role.text;
    c.module = flag_value("--module");
    c.no_python = flag_value("--no_python");
    c.run_path = flag_value("--run_path");
    if (c.run_path && (c.module || c.no_python)) {
      warnings_.push_back("--run_path takes precedence over " + std::string(c.module ? "-m" : "--no_python"));
    } else if (c.module && c.no_python) {
      throw UsageError("ddprun: --no_python and -m/--module cannot be used together");
    }
    if (auto g = given("--logs_specs")) {
      throw UsageError(
          "ddprun: --logs_specs=" + g->text +
          " is not supported by ddprun (LogsSpecs are Python plugins); use --log_dir, -r and -t");
    }
    c.log_dir = get("--log_dir").text;
    if (auto g = given("--local_addr")) c.local_addr = trim(g->text);
    Given redirects = get("--redirects"), tee = get("--tee");
    auto r = parse_std_spec(trim(redirects.text)), t = parse_std_spec(trim(tee.text));
    if (!r) fail(redirects, "0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3,... like 0:1,1:2");
    if (!t) fail(tee, "0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3,... like 0:1,1:2");
    c.redirects = *r;
    c.tee = *t;
    c.local_ranks_filter = parse_local_ranks_filter(get("--local_ranks_filter"));
    c.signals_to_handle = parse_signals(get("--signals_to_handle"));
    c.shutdown_timeout = seconds(get("--shutdown_timeout"));
    c.exit_barrier_timeout = seconds(get("--exit_barrier_timeout"));
    c.torchrun_exit_codes = one_of(get("--exit_codes"), {"ddprun", "torchrun"}) == "torchrun";
    c.hang_timeout = seconds(get("--hang_timeout"));
    c.store_memory_budget = byte_size(get("--store_memory_budget"), uint64_t{1} << 20);
    c.prestart = flag_value("--prestart");
    c.prestart_delay = seconds(get("--prestart_delay"));
    if (c.prestart && c.no_python && !c.run_path) {
      throw UsageError(
          "ddprun: --prestart pre-starts Python workers and cannot be used with --no_python; drop "
          "one of the two");
    }
    c.python = get("--python").text;
    if (!given("--python")) {
      for (const char* var : {"DDPRUN_PYTHON", "PYTHON_EXEC"}) {
        auto it = env_.find(var);
        if (it != env_.end() && !it->second.empty()) {
          c.python = it->second;
          break;
        }
      }
    }
    if (c.python.empty()) fail(get("--python"), "a Python interpreter path or name");
    c.dry_run = flag_value("--dry_run");
    Given level = get("--log_level");
    if (level.text == "warning") level.text = "warn";
    c.log_level = one_of(level, {"trace", "debug", "info", "warn", "error", "critical", "off"});
  }

  // Slurm mode: the derived settings become the defaults of their flags (see SlurmLaunch).
  void slurm(LaunchConfig& c) {
    bool forced = flag_value("--slurm"), off = flag_value("--no_slurm");
    if (forced && off) throw UsageError("ddprun: --slurm and --no_slurm cannot be used together");
    if (off) return;
    const bool standalone = c.rdzv_kind == RendezvousKind::kStandalone;
    if (forced && standalone) throw UsageError("ddprun: --slurm and --standalone cannot be used together");
    if (!forced) {
      if (!slurm_detected(env_) || standalone) return;
      for (const char* f : {"--nnodes", "--node_rank", "--master_addr", "--master_port", "--rdzv_endpoint"}) {
        if (given(f)) return;  // the user wrote their own Slurm glue: keep torchrun's behaviour
      }
    }
    std::string err;
    auto s = derive_slurm(env_, c.nproc_per_node, err);
    if (!s) {
      throw UsageError(forced ? "ddprun: --slurm: " + err
                              : "ddprun: Slurm job step detected (SLURM_JOB_ID, SLURM_PROCID): " + err +
                                    " (--no_slurm ignores Slurm)");
    }
    for (const auto& d : s->derived) {
      slurm_defaults_[d.setting] = Given{d.setting, d.value, d.source.substr(0, d.source.find('='))};
    }
    if (c.rdzv_kind == RendezvousKind::kC10d) {
      slurm_defaults_["--rdzv_endpoint"] =
          Given{"--rdzv_endpoint", rdzv::format_endpoint(s->first_host, s->ports[0]), "SLURM_JOB_ID"};
    }
    c.slurm = SlurmLaunch{.auto_detected = !forced, .settings = *s};
  }

  // After the flags are resolved: what Slurm still decides (launcher/slurm/slurm_launch.h).
  void slurm_finish(LaunchConfig& c) {
    auto was_given = [this](const std::string& flag) { return given(flag).has_value(); };
    finish_slurm_launch(c, was_given, master_port_given_);
  }

  // The passes over the flags, in this order: each reads the flags it resolves (given, else derived from
  // Slurm, else the default) and what the passes before it resolved, and resolves each value once.
  void convert(LaunchConfig& c) {
    nproc(c);              // --nproc_per_node: Slurm's task layout needs it
    backend(c);            // --rdzv_backend, --standalone: Slurm's defaults depend on them
    slurm(c);              // Slurm's derived settings become the defaults of their flags
    nnodes(c);             // --nnodes (maybe Slurm's)
    rendezvous(c);         // run id, --rdzv_conf, endpoint, node rank (maybe Slurm's): needs the node count
    launch(c);             // how each worker runs and what the agent does around it
    local_rank_arg(c);     // ddprun-launch's --local-rank=N: needs --no_python
    newer_torch_flags(c);  // --virtual-local-rank, --duplicate-*-filters, --numa-binding
    slurm_finish(c);       // what Slurm still decides once every flag is resolved
    fixed_port_for_many_nodes(c);
  }

  // The flags of torchrun 2.9 and later: --virtual-local-rank, --duplicate-*-filters, --numa-binding
  // (--event-log-handler: parse_operation_flags).
  void newer_torch_flags(LaunchConfig& c) {
    c.virtual_local_rank = flag_value("--virtual_local_rank");
    for (int lr = 0; c.virtual_local_rank && lr < c.nproc_per_node; ++lr) {
      if (agent::virtual_device(env_, lr)) continue;
      const std::string visible = env_.at("CUDA_VISIBLE_DEVICES");
      throw UsageError("ddprun: --virtual-local-rank gives local rank " + std::to_string(lr) +
                       " its entry of CUDA_VISIBLE_DEVICES='" + visible + "', which has only " +
                       std::to_string(split(visible, ',').size()) +
                       "; list one device per local rank (--nproc_per_node=" +
                       std::to_string(c.nproc_per_node) + ") or unset it");
    }
    if (auto g = given("--duplicate_stdout_filters"))
      c.duplicate_stdout_filters = comma_separated_list(g->text);
    if (auto g = given("--duplicate_stderr_filters"))
      c.duplicate_stderr_filters = comma_separated_list(g->text);
    if (auto g = given("--numa_binding")) numa_binding(c, *g);
  }

  // --numa-binding: the CPUs of every local rank, chosen now so that a machine without what the mode needs
  // (a GPU per local rank, first of all) is a usage error before anything starts.
  void numa_binding(LaunchConfig& c, const Given& g) {
    c.numa_binding = parse_numa_affinity(trim(g.text));
    if (!c.numa_binding) fail(g, "node, socket, exclusive or core-complex");
    NumaMachine machine;
    if (numa_machine_) {
      machine = numa_machine_();
    } else {
      auto cvd = env_.find("CUDA_VISIBLE_DEVICES");
      machine = read_numa_machine("/sys",
                                  cvd == env_.end() ? std::nullopt : std::optional<std::string>(cvd->second),
                                  current_cpu_set());
    }
    for (int lr = 0; lr < c.nproc_per_node; ++lr) {
      try {
        auto cpus = cpus_for_gpu(*c.numa_binding, lr, machine);
        c.worker_cpus.emplace_back(cpus.begin(), cpus.end());
      } catch (const NumaBindingError& e) {
        throw UsageError("ddprun: --numa-binding=" + g.text + ": " + e.what() +
                         " (NUMA binding is for GPU jobs; leave the flag out to run unbound)");
      }
    }
  }

  // Port 0 lets the store bind any free port: only its own node would know which.
  void fixed_port_for_many_nodes(const LaunchConfig& c) {
    const bool probed = c.slurm && !c.slurm->probe_ports.empty();
    if (c.rdzv_kind == RendezvousKind::kStandalone || c.max_nodes == 1 || probed || c.rdzv_endpoint.port != 0)
      return;
    const char* flag = given("--rdzv_endpoint") ? "--rdzv_endpoint" : "--master_port";
    throw UsageError(std::string("ddprun: port 0 (") + flag + "=" + get(flag).text +
                     ") means any free port, which the other nodes of --nnodes=" + get("--nnodes").text +
                     " could not know; give a fixed port");
  }

  ArgApp app_{"", "ddprun"};
  std::map<std::string, Opt> opts_;
  const Env& env_;
  std::function<int()> gpu_count_;
  std::function<NumaMachine()> numa_machine_;  // --numa-binding's machine; empty = read /sys
  bool launch_mode_;  // ddprun-launch: torch.distributed.launch's flags and --local-rank=N
  std::vector<std::string> warnings_;
  std::map<std::string, Given> slurm_defaults_;  // flag -> value derived from Slurm (get() falls back to it)
  std::optional<rdzv::Endpoint> endpoint_;       // --rdzv_endpoint, parsed (nullopt: none given)
  bool master_port_given_ = false;               // --master_port or PET_MASTER_PORT was given
};

}  // namespace

ParseResult parse_launch_config(const std::vector<std::string>& argv,
                                const std::map<std::string, std::string>& env,
                                const std::function<int()>& gpu_count, LaunchConfig& out,
                                const std::function<NumaMachine()>& numa_machine) {
  try {
    LaunchConfig c;
    const bool launch_mode = !argv.empty() && std::filesystem::path(argv[0]).filename() == "ddprun-launch";
    Parser parser(env, gpu_count, numa_machine, launch_mode);
    ParseResult r = parser.run(argv, c);
    if (!r.should_exit) out = std::move(c);
    return r;
  } catch (const UsageError& e) {
    return {2, true, e.what()};
  }
}

}  // namespace ddprun::launcher
