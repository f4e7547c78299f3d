#include "agent/spawn.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace ddprun::agent {
namespace {

// The child runs on this much stack: a few syscalls, no allocation.
constexpr size_t kChildStack = 64 * 1024;

// Shared between the child and its parent (CLONE_VM): the child writes it only when a step fails.
struct ChildArgs {
  const SpawnRequest* request;
  pid_t parent;
  volatile int error;
  const char* volatile failed_step;
};

[[noreturn]] void child_fail(ChildArgs& args, const char* step) {
  args.error = errno;
  args.failed_step = step;
  ::_exit(127);
}

int child_main(void* raw) {
  auto& args = *static_cast<ChildArgs*>(raw);
  const SpawnRequest& r = *args.request;
  if (r.new_process_group && ::setpgid(0, 0) != 0) child_fail(args, "setpgid");
  // The agent's handlers must not run in the child; ignored signals stay ignored except these two.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    const bool has_handler =
        (old.sa_flags & SA_SIGINFO) || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    if (has_handler || sig == SIGPIPE || sig == SIGXFSZ) ::sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) child_fail(args, "sigprocmask");
  if (r.death_signal != 0) {
    if (::prctl(PR_SET_PDEATHSIG, r.death_signal) != 0) child_fail(args, "prctl(PR_SET_PDEATHSIG)");
    if (::getppid() != args.parent) ::_exit(127);  // the agent died before prctl: nobody to run for
  }
  if (r.cgroup_procs_fd >= 0 && ::write(r.cgroup_procs_fd, "0", 1) != 1) child_fail(args, "join cgroup");
  if (r.affinity != nullptr && ::sched_setaffinity(0, sizeof(cpu_set_t), r.affinity) != 0) {
    child_fail(args, "sched_setaffinity");
  }
  // Like Python's close_fds=True: no fd of the agent but 0-2 survives exec. Older kernels (< 5.11): skipped.
  ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
  for (auto [fd, target] : {std::pair{r.stdout_fd, STDOUT_FILENO}, std::pair{r.stderr_fd, STDERR_FILENO},
                            std::pair{r.fd3, 3}}) {
    if (fd < 0) continue;
    if (fd == target ? ::fcntl(fd, F_SETFD, 0) != 0 : ::dup2(fd, target) < 0) child_fail(args, "dup2");
  }
  ::execve(r.path, r.argv, r.envp);
  child_fail(args, "execve");
}

// Blocks every signal of the calling thread for its lifetime.
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &saved_);
  }
  ~SignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t saved_;
};

}  // namespace

ExecStrings::ExecStrings(std::vector<std::string> argv, const std::map<std::string, std::string>& env)
    : argv_(std::move(argv)) {
  for (const auto& [key, value] : env) env_.push_back(key + "=" + value);
  for (auto& s : argv_) argv_ptrs_.push_back(s.data());
  for (auto& s : env_) env_ptrs_.push_back(s.data());
  argv_ptrs_.push_back(nullptr);
  env_ptrs_.push_back(nullptr);
}

cpu_set_t cpu_set_of(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) throw std::invalid_argument("CPU " + std::to_string(cpu) + " out of range");
    CPU_SET(cpu, &set);
  }
  return set;
}

SpawnedProcess spawn_process(const SpawnRequest& request, const std::string& who) {
  const std::string what = "'" + std::string(request.path ? request.path : "(null)") + "'";
  void* stack =
      ::mmap(nullptr, kChildStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED)
    throw std::system_error(errno, std::generic_category(), who + ": mmap of a stack to start " + what);

  ChildArgs args{&request, ::getpid(), 0, nullptr};
  int pidfd = -1;
  pid_t pid;
  int clone_errno = 0;
  {
    SignalsBlocked blocked;
    pid = ::clone(child_main, static_cast<char*>(stack) + kChildStack,
                  CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, &args, &pidfd);
    clone_errno = errno;
  }
  ::munmap(stack, kChildStack);
  if (pid < 0)
    throw std::system_error(clone_errno, std::generic_category(), who + ": clone(2) to start " + what);

  UniqueFd owned_pidfd(pidfd);
  if (args.failed_step != nullptr) {
    const int error = args.error;
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    throw std::system_error(error, std::generic_category(), who + ": " + args.failed_step + " of " + what);
  }
  return SpawnedProcess{pid, std::move(owned_pidfd)};
}

}  // namespace ddprun::agent
