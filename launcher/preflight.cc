#include "launcher/preflight.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/process/child.hpp>
#include <boost/process/io.hpp>
#include <boost/process/pipe.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <system_error>

#include "agent/process_context.h"
#include "rendezvous/store_error.h"
#include "rendezvous/store_server.h"

namespace ddprun::launcher {

namespace {

using Clock = std::chrono::steady_clock;

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

// A file descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The line of an interpreter's stderr that says why it failed: Python's "Fatal Python error: ..." when
// there is one, else the last non-empty line (a wrapper's own message: "pyenv: version `3.9' is not
// installed", "error while loading shared libraries: ...").
std::string telling_line(const std::string& err) {
  std::string last;
  size_t start = 0;
  while (start < err.size()) {
    size_t end = err.find('\n', start);
    if (end == std::string::npos) end = err.size();
    std::string line = err.substr(start, end - start);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.rfind("Fatal Python error:", 0) == 0) return line;
    if (!line.empty()) last = line;
    start = end + 1;
  }
  return last;
}

}  // namespace

std::optional<std::string> interpreter_problem(const std::string& exe, const std::string& shown,
                                               const std::map<std::string, std::string>& env,
                                               std::chrono::milliseconds deadline) {
  const std::string what = "ddprun: the interpreter '" + shown + "'" + (shown == exe ? "" : " (" + exe + ")");
  const std::string advice = "; fix it, or give another with --python PATH (or DDPRUN_PYTHON)";
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return std::nullopt;  // cannot check: not the interpreter's fault
  Fd read_end(pipe_fds[0]), write_end(pipe_fds[1]);

  std::vector<std::string> env_strings;
  env_strings.reserve(env.size());
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string a0 = exe, a1 = "-S", a2 = "-c", a3;
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.fd, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Default signal dispositions and an empty mask in the child (the agent may block or ignore some).
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int spawn_error = ::posix_spawn(&pid, exe.c_str(), &actions, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawn_error != 0) {
    return what + " cannot be executed: " + std::strerror(spawn_error) + advice;
  }
  ::close(write_end.fd);
  write_end.fd = -1;

  // Read its stderr until it exits (its pidfd) or the deadline passes. A descendant that keeps stderr open
  // does not delay the verdict: the interpreter's own exit decides.
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  std::string err;
  const auto until = Clock::now() + deadline;
  bool exited = false, eof = false;
  while (!exited) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) break;
    pollfd fds[2];
    nfds_t nfds = 0;
    int pipe_at = -1, pid_at = -1;
    if (!eof) {
      fds[nfds] = {read_end.fd, POLLIN, 0};
      pipe_at = static_cast<int>(nfds++);
    }
    if (pidfd.fd >= 0) {
      fds[nfds] = {pidfd.fd, POLLIN, 0};
      pid_at = static_cast<int>(nfds++);
    }
    // Without a pidfd (Linux < 5.3) the exit is polled every 5 ms.
    const int timeout = static_cast<int>(pid_at >= 0 ? left : std::min<long long>(left, 5));
    if (::poll(fds, nfds, timeout) < 0 && errno != EINTR) break;
    if (pipe_at >= 0 && fds[pipe_at].revents != 0) {
      char buf[4096];
      const ssize_t r = ::read(read_end.fd, buf, sizeof buf);
      if (r > 0 && err.size() < 65536) err.append(buf, static_cast<size_t>(r));
      if (r == 0) eof = true;
    }
    if (pid_at >= 0) {
      exited = fds[pid_at].revents != 0;
    } else {
      siginfo_t info{};
      exited = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
    }
  }
  if (!exited) {
    ::kill(pid, SIGKILL);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    std::cerr << "ddprun: warning: the interpreter '" << shown << "' did not finish `-S -c ''` within "
              << deadline.count() << " ms; not checked, going on\n";
    return std::nullopt;
  }
  // What it wrote before exiting is in the pipe now.
  ::fcntl(read_end.fd, F_SETFL, O_NONBLOCK);
  for (char buf[4096];;) {
    const ssize_t r = ::read(read_end.fd, buf, sizeof buf);
    if (r <= 0 || err.size() >= 65536) break;
    err.append(buf, static_cast<size_t>(r));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::nullopt;
  std::string how = WIFSIGNALED(status) ? "was killed by " + agent::signal_name(WTERMSIG(status))
                                        : "exited with " + std::to_string(WEXITSTATUS(status));
  const std::string line = telling_line(err);
  return what + " does not run: `" + shown + " -S -c ''` " + how + (line.empty() ? "" : ": " + line) + advice;
}

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
  std::string program_path;
  for (std::string e : {check_program(config, env, program_path), check_script(config, cwd)}) {
    if (!e.empty()) errors.push_back(std::move(e));
  }
  // Nothing is spawned when the launch cannot go on anyway: a problem above, or a busy store port (reported
  // with its own exit code by the rendezvous handler's bind, which comes next).
  if (!errors.empty() || !runs_interpreter(config) || !store_port_free(config)) return errors;
  if (auto problem = interpreter_problem(program_path, config.worker_argv(0).front(), env)) {
    errors.push_back(std::move(*problem));
  }
  return errors;
}

}  // namespace ddprun::launcher
