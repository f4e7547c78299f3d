// RunDirectory: where one agent run keeps its files. With --log_dir, torchrun's layout in a fresh
// <log_dir>/<run_id>_<random> (agent/log_layout.h); without, a temporary directory for the error files, which
// the agent removes when the job succeeds (and keeps on failure). Beside the workers' logs, the files the
// agent gives its Python workers: the stack-dump hook (python_hooks/sitecustomize.py, when hang detection or
// the FileTimer is on), the --prestart stub (python_hooks/ddprun_prestart.py) and, with --state_memory, the
// package ddprun (python_hooks/ddprun/, agent/state/python_package.h).
//
// Errors: create() throws std::filesystem::filesystem_error, write_hooks() std::runtime_error, each naming
// the path. Not thread-safe. Internal to the agent loop.
#pragma once

#include <filesystem>
#include <string>

#include "agent/agent_config.h"
#include "agent/log_layout.h"

namespace ddprun::agent {

class RunDirectory {
 public:
  // Creates the run directory for `run_id` (config.log_dir, or a temporary one).
  static RunDirectory create(const AgentConfig& config, const std::string& run_id);

  // Writes the hook and the stub that `config` asks for.
  void write_hooks(const AgentConfig& config) const;
  // Removes the directory if it is a temporary one (the job succeeded); errors are ignored.
  void remove_if_temporary() const;

  const LogLayout& layout() const { return layout_; }
  std::filesystem::path prestart_stub() const;

 private:
  RunDirectory(LogLayout layout, bool temporary) : layout_(std::move(layout)), temporary_(temporary) {}

  LogLayout layout_;
  bool temporary_;
};

}  // namespace ddprun::agent
