#include "agent/loop/run_directory.h"

#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <cerrno>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "agent/process/prestart.h"
#include "agent/state/python_package.h"
#include "agent/watchdog/stack_dump.h"

namespace ddprun::agent {

namespace {

// Writes `text` to `file` (creating its directory); a failure names `what` (the file, or its directory).
void write_file(const std::filesystem::path& file, const std::string& text,
                const std::filesystem::path& what) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + what.string());
}

}  // namespace

RunDirectory RunDirectory::create(const AgentConfig& config, const std::string& run_id) {
  if (!config.log_dir.empty()) {
    RunDirectory dir(LogLayout::create(config.log_dir, run_id), false);
    spdlog::info("worker logs in {}", dir.layout_.run_dir().string());
    return dir;
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / ("ddprun-" + run_id + "-XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) {
    throw std::filesystem::filesystem_error("cannot create a temporary log directory", tmpl,
                                            std::error_code(errno, std::generic_category()));
  }
  return RunDirectory(LogLayout(tmpl), true);
}

void RunDirectory::write_hooks(const AgentConfig& config) const {
  if (stack_capture_enabled(config)) {
    const auto hooks = LogLayout::python_hook_dir(layout_.run_dir());
    write_file(hooks / "sitecustomize.py", python_stack_hook(), hooks);
  }
  if (config.prestart) write_file(prestart_stub(), prestart_stub_source(), prestart_stub());
  if (config.state.enabled()) {
    const auto hooks = LogLayout::python_hook_dir(layout_.run_dir());
    for (const auto& [file, text] : state_python_package()) write_file(hooks / file, text, hooks / file);
  }
}

void RunDirectory::remove_if_temporary() const {
  if (!temporary_) return;
  std::error_code ignored;
  std::filesystem::remove_all(layout_.run_dir(), ignored);
}

std::filesystem::path RunDirectory::prestart_stub() const {
  return LogLayout::python_hook_dir(layout_.run_dir()) / "ddprun_prestart.py";
}

}  // namespace ddprun::agent
