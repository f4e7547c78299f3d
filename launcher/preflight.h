// Preflight: what can be checked on this node before the rendezvous, so that a mistake fails at once instead
// of after every node has joined (or after the join timeout): the program the workers run (--python, or the
// program itself with --no_python) and the training script. Exit code 2 (kExitUsage) in docs/cli.md.
//
// Not checked here: the log directory (the agent creates it before the rendezvous, exit 5) and the store's
// port (bound before the rendezvous, exit 3).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/launch_config.h"

namespace ddprun::launcher {

// ddprun-launch's "auto" local_rank_arg: "--local-rank" when the torch that `python` imports is 2.x or later
// (torch >= 2.0 passes the dashed spelling), "--local_rank" for 1.x, "--local-rank" when it cannot tell
// (no torch, or no interpreter). Runs `python -c` with importlib.metadata (about 0.1 s).
std::string torch_local_rank_arg(const std::string& python, const std::map<std::string, std::string>& env);

// One message per problem, each naming what is wrong and what to do; empty when the launch can go on.
// `env` is the agent's environment (its PATH finds the program as the workers' exec will); `cwd` is where
// relative script paths are read from.
std::vector<std::string> preflight(const LaunchConfig& config, const std::map<std::string, std::string>& env,
                                   const std::string& cwd);

}  // namespace ddprun::launcher
