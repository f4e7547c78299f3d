#include "launcher/preflight.h"

#include <unistd.h>

#include <boost/process/child.hpp>
#include <boost/process/io.hpp>
#include <boost/process/pipe.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "agent/process_context.h"

namespace ddprun::launcher {

namespace {

// The program of local rank 0's argv (every local rank runs the same one).
std::string check_program(const LaunchConfig& c, const std::map<std::string, std::string>& env) {
  const std::string program = c.worker_argv(0).front();
  const bool interpreter = !c.no_python || c.run_path;
  try {
    agent::find_program(program, env, interpreter ? "--python" : "the training program");
    return "";
  } catch (const std::system_error& e) {
    return "ddprun: " + std::string(e.what()) +
           (interpreter ? "; give an interpreter with --python PATH (or DDPRUN_PYTHON)"
                        : "; with --no_python the script must be an executable program (a path, or a name in PATH)");
  }
}

// The script Python is asked to run (python -u SCRIPT): it must exist and be readable. A module (-m) is
// Python's to find.
std::string check_script(const LaunchConfig& c, const std::string& cwd) {
  if ((c.no_python && !c.run_path) || (c.module && !c.run_path)) return "";
  const std::string script = substitute_local_rank(c.training_script, 0);
  std::filesystem::path path(script);
  if (path.is_relative()) path = std::filesystem::path(cwd) / path;
  if (::access(path.c_str(), R_OK) == 0) return "";
  const int err = errno;
  std::string msg = "ddprun: cannot read the training script '" + script + "'" +
                    (std::filesystem::path(script).is_relative() ? " (in " + cwd + ")" : "") + ": " +
                    std::strerror(err);
  if (err == ENOENT) msg += "; check the path, or use -m for a module and --no_python for a program";
  return msg;
}

}  // namespace

std::string torch_local_rank_arg(const std::string& python, const std::map<std::string, std::string>& env) {
  namespace bp = boost::process;
  try {
    const std::string exe = agent::find_program(python, env, "--python");
    bp::ipstream out;
    bp::child child(exe, "-c", "import importlib.metadata as m; print(m.version('torch'))", bp::std_out > out,
                    bp::std_err > bp::null, bp::std_in < bp::null);
    std::string version;
    std::getline(out, version);
    child.wait();
    if (child.exit_code() == 0 && version.rfind("1.", 0) == 0) return "--local_rank";
  } catch (const std::exception&) {
    // no interpreter, no torch: the current spelling
  }
  return "--local-rank";
}

std::vector<std::string> preflight(const LaunchConfig& config, const std::map<std::string, std::string>& env,
                                   const std::string& cwd) {
  std::vector<std::string> errors;
  for (std::string e : {check_program(config, env), check_script(config, cwd)}) {
    if (!e.empty()) errors.push_back(std::move(e));
  }
  return errors;
}

}  // namespace ddprun::launcher
