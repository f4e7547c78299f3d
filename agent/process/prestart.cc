#include "agent/process/prestart.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

#include "agent/process/spawn.h"

namespace ddprun::agent {
namespace {

std::system_error errno_error(int error, const std::string& what) {
  return std::system_error(error, std::generic_category(), what);
}

}  // namespace

const std::string& prestart_stub_source() {
  static const std::string source =
#include "prestart_stub.inc"
      ;
  return source;
}

Standby start_standby(const WorkerLaunch& like, size_t interpreter_args, const std::filesystem::path& stub,
                      int cgroup_fd, int cgroup_procs_fd) {
  if (interpreter_args == 0 || interpreter_args >= like.argv.size()) {
    throw std::logic_error("start_standby: no script after the interpreter's arguments");
  }
  const std::string who = "cannot pre-start local_rank " + std::to_string(like.local_rank);
  Standby standby;
  standby.local_rank = like.local_rank;
  standby.interpreter.assign(like.argv.begin(), like.argv.begin() + static_cast<long>(interpreter_args));
  const std::string exe = find_program(like.argv[0], like.env, who);

  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    throw errno_error(errno, who + ": socketpair");
  }
  standby.channel.reset(pair[0]);
  UniqueFd child_end(pair[1]);

  std::vector<std::string> argv = standby.interpreter;
  argv.push_back(stub.string());
  ExecStrings strings(std::move(argv), like.env);
  const cpu_set_t affinity = cpu_set_of(like.cpu_affinity);

  UniqueFd null_stdin;  // the launch's stdin: a standby is released with its fd 0 as it is
  if (like.stdin_mode == WorkerLaunch::Stdin::kNull) {
    null_stdin.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (null_stdin.get() < 0) throw errno_error(errno, who + ": cannot open /dev/null");
  }

  SpawnRequest request;
  request.path = exe.c_str();
  request.argv = strings.argv();
  request.envp = strings.envp();
  request.death_signal = SIGKILL;
  request.fd3 = child_end.get();
  request.stdin_fd = null_stdin.get();
  request.cgroup_fd = cgroup_fd;
  request.cgroup_procs_fd = cgroup_procs_fd;
  request.affinity = like.cpu_affinity.empty() ? nullptr : &affinity;
  SpawnedProcess child = spawn_process(request, who);
  standby.pid = child.pid;
  standby.pidfd = std::move(child.pidfd);
  return standby;
}

bool standby_fits(const Standby& standby, const WorkerLaunch& w) {
  const size_t n = standby.interpreter.size();
  return standby.local_rank == w.local_rank && w.argv.size() > n &&
         std::equal(standby.interpreter.begin(), standby.interpreter.end(), w.argv.begin());
}

void release(Standby& standby, const WorkerLaunch& w, int out_fd, int err_fd) {
  nlohmann::json message;
  message["argv"] =
      std::vector<std::string>(w.argv.begin() + static_cast<long>(standby.interpreter.size()), w.argv.end());
  message["env"] = w.env;
  message["stdout"] = out_fd >= 0;
  message["stderr"] = err_fd >= 0;
  const std::string text = message.dump();

  int fds[2];
  size_t nfds = 0;
  for (int fd : {out_fd, err_fd}) {
    if (fd >= 0) fds[nfds++] = fd;
  }
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  struct iovec iov {
    const_cast<char*>(text.data()), text.size()
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t sent;
  do {
    sent = ::sendmsg(standby.channel.get(), &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(text.size())) {
    throw errno_error(sent < 0 ? errno : EMSGSIZE, "cannot release the pre-started worker of local_rank " +
                                                       std::to_string(w.local_rank) + " (pid " +
                                                       std::to_string(standby.pid) + ")");
  }
  standby.channel.reset();
}

}  // namespace ddprun::agent
