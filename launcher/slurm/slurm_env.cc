#include "launcher/slurm/slurm_env.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "launcher/hostlist.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {
namespace {

using Env = std::map<std::string, std::string>;

constexpr uint64_t kPortBase = 20000, kPortSpan = 10000, kPortStride = 1009;
constexpr int kPortCandidates = 8;

// A variable's value and its name, for messages: "SLURM_NNODES=2".
struct Var {
  std::string name, value;
  std::string show() const { return name + "=" + value; }
};

// The first of `names` that is set and non-empty.
std::optional<Var> first_of(const Env& env, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = env.find(n);
    if (it != env.end() && !it->second.empty()) return Var{n, it->second};
  }
  return std::nullopt;
}

// An inconsistent or incomplete environment; what() is the whole message.
class DeriveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Deriver {
 public:
  Deriver(const Env& env, int nproc) : env_(env), nproc_(nproc) {}

  std::optional<SlurmSettings> run(std::string& error) {
    try {
      derive();
      return s_;
    } catch (const DeriveError& e) {
      error = e.what();
      return std::nullopt;
    }
  }

 private:
  [[noreturn]] static void fail(const std::string& message) { throw DeriveError(message); }

  // A non-negative integer variable; nullopt when none of `names` is set.
  std::optional<std::pair<Var, int>> number(std::initializer_list<const char*> names) {
    auto v = first_of(env_, names);
    if (!v) return std::nullopt;
    const auto n = parse_uint(v->value);
    if (!n || *n > 1'000'000) fail(v->show() + " is not a number; is this environment really Slurm's?");
    return std::make_pair(*v, static_cast<int>(*n));
  }

  void derive() {
    auto job = first_of(env_, {"SLURM_JOB_ID", "SLURM_JOBID"});
    if (!job) {
      fail(
          "SLURM_JOB_ID is not set: ddprun is not running inside a Slurm job (start it with srun, inside "
          "sbatch or salloc)");
    }
    const auto job_number = parse_uint(job->value);
    if (!job_number) fail(job->show() + " is not a job number");
    s_.job_id = job->value;
    s_.ports = slurm_port_candidates(*job_number);

    auto step = first_of(env_, {"SLURM_STEP_ID", "SLURM_STEPID"});
    auto job_nodes = number({"SLURM_JOB_NUM_NODES", "SLURM_NNODES"});
    if (!step) {
      batch(job_nodes);
    } else {
      in_step(*step, job_nodes);
    }
    s_.step_token = s_.job_id + "." + (step ? step->value : "batch");
    if (auto restart = first_of(env_, {"SLURM_RESTART_COUNT"})) s_.step_token += ".r" + restart->value;
    s_.derived.push_back({"--rdzv_id", s_.job_id, job->show()});
    s_.derived.push_back({"--master_port", std::to_string(s_.ports[0]),
                          job->show() + " (probed in order: " + format_ports(s_.ports) + ")"});
  }

  // ddprun started by the batch script itself: fine for a one-node job, never for more.
  void batch(const std::optional<std::pair<Var, int>>& job_nodes) {
    if (job_nodes && job_nodes->second > 1) {
      fail("SLURM_STEP_ID is unset, so ddprun runs in the batch script of a " +
           std::to_string(job_nodes->second) + "-node job (" + job_nodes->first.show() +
           "): only this node would start and the others would never join; launch it with srun, one task per "
           "node (srun --ntasks-per-node=1 ddprun ...)");
    }
    auto nodelist = first_of(env_, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
    if (!nodelist) fail("SLURM_JOB_NODELIST is not set; is this environment really Slurm's?");
    auto hosts = hostlist(*nodelist);
    if (hosts.size() != 1)
      fail(nodelist->show() + " names " + std::to_string(hosts.size()) + " hosts; expected 1");
    s_.batch_step = true;
    s_.first_host = hosts[0];
    s_.derived.push_back({"--nnodes", "1",
                          job_nodes ? job_nodes->first.show() + " (batch script, no srun step)"
                                    : "batch script (no srun step)"});
    s_.derived.push_back({"--node_rank", "0", "batch script (no srun step)"});
    s_.derived.push_back({"--master_addr", s_.first_host, nodelist->show()});
  }

  void in_step(const Var& step, const std::optional<std::pair<Var, int>>& job_nodes) {
    auto procid = number({"SLURM_PROCID"});
    if (!procid)
      fail("SLURM_PROCID is not set although " + step.show() + " is; is this environment Slurm's?");
    auto nodes = number({"SLURM_STEP_NUM_NODES", "SLURM_NNODES"});
    if (!nodes || nodes->second < 1)
      fail("SLURM_STEP_NUM_NODES is not set (or 0) in Slurm step " + step.value);
    auto nodelist = first_of(env_, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"});
    if (!nodelist) fail("SLURM_STEP_NODELIST is not set in Slurm step " + step.value);
    auto hosts = hostlist(*nodelist);
    const int n = nodes->second;
    if (static_cast<int>(hosts.size()) != n) {
      fail(nodes->first.show() + " but " + nodelist->show() + " names " + std::to_string(hosts.size()) +
           " hosts: the step's variables disagree");
    }
    if (job_nodes && job_nodes->second < n && job_nodes->first.name == "SLURM_JOB_NUM_NODES") {
      fail("the step has more nodes than its job (" + nodes->first.show() + ", " + job_nodes->first.show() +
           "): the step's and the job's variables disagree");
    }
    auto nodeid = number({"SLURM_NODEID"});
    if (!nodeid) fail("SLURM_NODEID is not set in Slurm step " + step.value);
    if (nodeid->second >= n) fail(nodeid->first.show() + " is not below " + nodes->first.show());

    // Tasks per node: "1(x2)" -> {1, 1}.
    std::vector<int> per_node(static_cast<size_t>(n), 1);
    std::optional<Var> tpn_var = first_of(env_, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
    if (tpn_var) {
      std::string err;
      auto tpn = expand_tasks_per_node(tpn_var->value, err);
      if (!tpn) fail(err);
      if (static_cast<int>(tpn->size()) != n) {
        fail(tpn_var->show() + " describes " + std::to_string(tpn->size()) + " nodes but " +
             nodes->first.show() + ": the step's variables disagree");
      }
      per_node = *tpn;
    }
    const int tasks = std::accumulate(per_node.begin(), per_node.end(), 0);
    auto ntasks = number({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
    if (ntasks && tpn_var && ntasks->second != tasks) {
      fail(ntasks->first.show() + " but " + tpn_var->show() + " adds up to " + std::to_string(tasks) +
           " tasks: the step's variables disagree");
    }
    const int total_tasks = ntasks ? ntasks->second : tasks;
    if (procid->second >= total_tasks) {
      fail(procid->first.show() + " is not below the step's " + std::to_string(total_tasks) + " tasks");
    }
    const int most = *std::max_element(per_node.begin(), per_node.end());
    s_.first_host = hosts[0];
    if (most == 1 && total_tasks == n) {
      s_.nnodes = n;
      s_.node_rank = nodeid->second;
      s_.derived.push_back({"--nnodes", std::to_string(n), nodes->first.show()});
      s_.derived.push_back({"--node_rank", std::to_string(s_.node_rank), nodeid->first.show()});
    } else {
      std::string layout = tpn_var ? tpn_var->show() : ntasks->first.show() + " on " + nodes->first.show();
      if (nproc_ > 1) {
        fail("Slurm started several tasks on a node (" + layout +
             ") and each would start --nproc_per_node=" + std::to_string(nproc_) +
             " workers; run one task per node (srun --ntasks-per-node=1 ddprun ...), or one worker per task "
             "(--nproc_per_node=1)");
      }
      if (procid->second == 0 && nodeid->second != 0) {
        fail("task 0 runs on node " + std::to_string(nodeid->second) + " (" + nodeid->first.show() +
             "), not on the first host " + hosts[0] +
             ", where the others will look for its store; use a block "
             "or cyclic task distribution, or one task per node");
      }
      s_.task_mode = true;
      s_.nnodes = total_tasks;
      s_.node_rank = procid->second;
      std::string tasks_source = ntasks ? ntasks->first.show() : tpn_var->show();
      s_.derived.push_back({"--nnodes", std::to_string(s_.nnodes), tasks_source + " (one agent per task)"});
      s_.derived.push_back({"--node_rank", std::to_string(s_.node_rank), procid->first.show()});
    }
    s_.derived.push_back({"--master_addr", s_.first_host, nodelist->show() + " (first host)"});
  }

  std::vector<std::string> hostlist(const Var& v) {
    std::string err;
    auto hosts = expand_hostlist(v.value, err);
    if (!hosts) fail(v.name + ": " + err);
    return *hosts;
  }

  const Env& env_;
  int nproc_;
  SlurmSettings s_;
};

}  // namespace

bool slurm_detected(const std::map<std::string, std::string>& env) {
  return first_of(env, {"SLURM_JOB_ID"}).has_value() && first_of(env, {"SLURM_PROCID"}).has_value();
}

std::optional<SlurmSettings> derive_slurm(const std::map<std::string, std::string>& env, int nproc_per_node,
                                          std::string& error) {
  return Deriver(env, nproc_per_node).run(error);
}

std::vector<uint16_t> slurm_port_candidates(uint64_t job_id) {
  std::vector<uint16_t> ports;
  for (uint64_t k = 0; k < kPortCandidates; ++k) {
    ports.push_back(static_cast<uint16_t>(kPortBase + (job_id % kPortSpan + kPortStride * k) % kPortSpan));
  }
  return ports;
}

std::string format_ports(const std::vector<uint16_t>& ports) {
  std::string out;
  for (uint16_t p : ports) out += (out.empty() ? "" : ",") + std::to_string(p);
  return out;
}

}  // namespace ddprun::launcher
