#include "launcher/preflight.h"

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "agent/process/worker_launch.h"
#include "launcher/interpreter_check.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_server.h"

namespace ddprun::launcher {

namespace {

// Whether the workers' program is an interpreter (python -u ...) rather than the program itself.
bool runs_interpreter(const LaunchConfig& c) {
  return !c.no_python || c.run_path;
}

// The program of local rank 0's argv (every local rank runs the same one): its path, or a message.
std::string check_program(const LaunchConfig& c, const std::map<std::string, std::string>& env,
                          std::string& path) {
  const std::string program = c.worker_argv(0).front();
  const bool interpreter = runs_interpreter(c);
  try {
    path = agent::find_program(program, env, interpreter ? "--python" : "the training program");
    return "";
  } catch (const std::system_error& e) {
    return "ddprun: " + std::string(e.what()) +
           (interpreter
                ? "; give an interpreter with --python PATH (or DDPRUN_PYTHON)"
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

// --log_dir: created as the agent creates it (std::filesystem::create_directories; torchrun: os.makedirs) and
// writable, so that a node that does not host the store learns of a mistake now, not after the rendezvous.
std::string check_log_dir(const LaunchConfig& c, const std::string& cwd) {
  if (c.log_dir.empty()) return "";
  std::filesystem::path dir(c.log_dir);
  if (dir.is_relative()) dir = std::filesystem::path(cwd) / dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec && ::access(dir.c_str(), W_OK | X_OK) != 0) ec.assign(errno, std::generic_category());
  if (!ec) return "";
  return "ddprun: --log_dir '" + c.log_dir + "'" +
         (dir.string() != c.log_dir ? " (" + dir.string() + ")" : "") +
         ": cannot create it or write in it: " + ec.message() +
         "; give a directory this user may write, or leave --log_dir out (logs then go to a temporary "
         "directory)";
}

}  // namespace

bool store_port_free(const LaunchConfig& c) {
  if (c.slurm && !c.slurm->probe_ports.empty()) return true;  // the port is probed among candidates
  const bool hosts = (c.rdzv_kind == RendezvousKind::kStatic && c.node_rank == 0) ||
                     (c.rdzv_kind == RendezvousKind::kC10d && c.is_host.value_or(false));
  if (!hosts || c.rdzv_endpoint.port == 0) return true;
  // Exactly the store's bind (all interfaces, dual stack, SO_REUSEADDR: nothing lingers after the close).
  try {
    boost::asio::io_context io;
    rdzv::StoreServerOptions o;
    o.port = c.rdzv_endpoint.port;
    o.max_connections = 1;
    rdzv::StoreServer probe(io, o);
    probe.stop();
    return true;
  } catch (const rdzv::BindError&) {
    return false;
  }
}

std::vector<std::string> preflight(const LaunchConfig& config, const std::map<std::string, std::string>& env,
                                   const std::string& cwd) {
  std::vector<std::string> errors;
  std::string program_path;
  for (std::string e :
       {check_program(config, env, program_path), check_script(config, cwd), check_log_dir(config, cwd)}) {
    if (!e.empty()) errors.push_back(std::move(e));
  }
  // Nothing is spawned when the launch cannot go on anyway: a problem above, or a busy store port (reported
  // with its own exit code by the rendezvous handler's bind, which comes next).
  if (!errors.empty() || !runs_interpreter(config) || !store_port_free(config)) return errors;
  InterpreterCheck check{.exe = program_path, .shown = config.worker_argv(0).front(), .env = env, .cwd = cwd};
  if (auto problem = interpreter_problem(check)) {
    errors.push_back(std::move(*problem));
  }
  return errors;
}

}  // namespace ddprun::launcher
