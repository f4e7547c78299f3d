// Preflight: what can be checked on this node before the rendezvous, so that a mistake fails at once instead
// of after every node has joined (or after the join timeout), and before anything is spawned:
//   1. the program the workers run (--python, or the program itself with --no_python) is there and
//      executable, and the training script is readable;
//   2. the store port, when this node hosts the store, can be bound (store_port_free);
//   3. the interpreter runs (launcher/interpreter_check.h: `<python> -S -c ''` exits 0 within a short
//      deadline; a success is remembered, so the same interpreter is not started again);
//   4. --log_dir can be created (it is, as the agent would) and written in.
// 1, 3 and 4 are problems for exit code 2 (kExitUsage, docs/cli.md). A busy port is not reported here: its
// error and exit code (3) are the store's own (rdzv::BindError, thrown by the rendezvous handler that binds
// the port right after the preflight); the preflight only makes sure that nothing is spawned, not even the
// interpreter check, when the port is busy.
//
// The agent's own creation of the run directory inside --log_dir can still fail later (exit 5: a disk that
// filled up meanwhile).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/launch_config.h"

namespace ddprun::launcher {

// One message per problem, each naming what is wrong and what to do; empty when the launch can go on.
// `env` is the agent's environment (its PATH finds the program as the workers' exec will; the interpreter
// check runs with it, as the workers will); `cwd` is where relative script paths are read from. Blocks for
// the interpreter check (an interpreter start when its success is not remembered; kInterpreterDeadline at
// most).
std::vector<std::string> preflight(const LaunchConfig& config, const std::map<std::string, std::string>& env,
                                   const std::string& cwd);

// Whether the port of the store this node hosts can be bound now: true when this node hosts no store on a
// fixed port (a worker node, c10d without is_host=1, --standalone's free port, Slurm's probed ports), else
// a bind and listen exactly as the store does them (rdzv::StoreServer), closed at once. Never throws.
bool store_port_free(const LaunchConfig& config);

}  // namespace ddprun::launcher
