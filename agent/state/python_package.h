// The Python package ddprun (agent/state/python/ddprun/: __init__.py, state.py, checkpoint.py), compiled into
// the agent and written into the run directory's python_hooks/ (agent/loop/run_directory.h) for a job with
// --state_memory, so that `import ddprun.state` works in every worker without an install (PYTHONPATH:
// agent/worker_launches.h). The same directory is a plain package for the wheel.
//
// Pure; thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ddprun::agent {

// (path relative to python_hooks/, source text) of every file of the package.
const std::vector<std::pair<std::string, std::string>>& state_python_package();

}  // namespace ddprun::agent
