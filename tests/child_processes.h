// Test support: child processes with captured output and a hard deadline, for tests that start real
// programs (the launcher, a worker, the test binary itself). Header-only; POSIX.
//
//   std::vector<ddprun::testing::Child> cs;
//   cs.push_back(ddprun::testing::spawn_child({"/path/prog", "arg"}, {"VAR=value"}));
//   ddprun::testing::wait_children(cs, std::chrono::seconds(240));   // cs[i].exit_code, cs[i].output
//
// Each child runs in a process group of its own with stdout and stderr on one pipe; `extra_env` entries
// replace inherited variables of the same name. wait_children collects the output until every child has
// closed it, SIGKILLs every child's group at the deadline, then reaps each child and SIGKILLs what is left of
// its group: nothing a test started outlives the call. exit_code is 128+N for a child killed by signal N.
// spawn_child fails the current Catch2 test (REQUIRE) when the program cannot be started.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "catch_compat.h"

extern char** environ;

namespace ddprun::testing {

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of its stdout+stderr; -1 once closed
  std::string output;
  int exit_code = -1;
};

inline Child spawn_child(std::vector<std::string> argv, const std::vector<std::string>& extra_env) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('=') + 1);
    const bool replaced = std::any_of(extra_env.begin(), extra_env.end(),
                                      [&](const std::string& x) { return x.rfind(name, 0) == 0; });
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  int pipefd[2];
  REQUIRE(::pipe2(pipefd, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  Child c;
  const int rc = posix_spawn(&c.pid, cargv[0], &fa, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(pipefd[1]);
  if (rc != 0) ::close(pipefd[0]);
  INFO("posix_spawn " << argv[0]);
  REQUIRE(rc == 0);
  c.fd = pipefd[0];
  return c;
}

inline void wait_children(std::vector<Child>& children, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool killed = false;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Child*> open;
    for (auto& c : children) {
      if (c.fd < 0) continue;
      fds.push_back({c.fd, POLLIN, 0});
      open.push_back(&c);
    }
    if (fds.empty()) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 && !killed) {
      for (auto& c : children) ::kill(-c.pid, SIGKILL);
      killed = true;
      for (auto& c : children) c.output += "\n[test: killed after " + std::to_string(limit.count()) + " s]\n";
    }
    ::poll(fds.data(), fds.size(), killed ? 1000 : static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;  // only ready pipes: a read of the others would block
      Child& c = *open[i];
      char buf[4096];
      const ssize_t k = ::read(c.fd, buf, sizeof buf);
      if (k > 0) {
        c.output.append(buf, static_cast<size_t>(k));
      } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
  }
  for (auto& c : children) {
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    ::kill(-c.pid, SIGKILL);  // anything left in its group
    c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
}

}  // namespace ddprun::testing
