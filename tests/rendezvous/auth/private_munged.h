// PrivateMunged: a munged of its own in a fresh directory (its own key and socket, run as the munge user, as
// scripts/slurm-cluster.sh does), so that the host's munge is neither needed nor touched; stopped and removed
// by the destructor. Needs root (munged runs as the munge user) and munged (scripts/install-deps.sh):
// can_run_munged() says whether this test may start one. Header-only, for Catch2 tests.
#pragma once

#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "catch_compat.h"
#include "eventually.h"
#include "rendezvous/auth/munge_auth.h"

namespace ddprun::testing {

inline bool can_run_munged() {
  if (::geteuid() != 0) {
    WARN("skipped: munged must run as the munge user, which needs root");
    return false;
  }
  return true;
}

class PrivateMunged {
 public:
  PrivateMunged() {
    char name[] = "/tmp/ddprun-munge-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    dir_ = name;
    const passwd* munge = ::getpwnam("munge");
    INFO("no munge user: install munge (scripts/install-deps.sh)");
    REQUIRE(munge != nullptr);
    {
      std::ofstream key(dir_ / "munge.key", std::ios::binary);
      std::random_device rd;
      for (int i = 0; i < 1024; ++i) key.put(static_cast<char>(rd()));
    }
    for (const std::filesystem::path& p : {dir_, dir_ / "munge.key"})
      REQUIRE(::chown(p.c_str(), munge->pw_uid, munge->pw_gid) == 0);
    ::chmod(dir_.c_str(), 0755);  // every client reaches the socket
    ::chmod((dir_ / "munge.key").c_str(), 0400);
    const std::string d = dir_.string();
    const std::string command =
        "runuser -u munge -- munged --key-file=" + d + "/munge.key --socket=" + socket() +
        " --pid-file=" + d + "/munged.pid --log-file=" + d + "/munged.log --seed-file=" + d + "/munged.seed";
    INFO("munged did not start: see " << d << "/munged.log");
    REQUIRE(std::system(command.c_str()) == 0);
    REQUIRE(eventually([&] { return rdzv::MungeAuth(socket(), "check").check().empty(); }));
  }
  ~PrivateMunged() {
    if (pid_t pid = this->pid(); pid > 0) {
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGTERM);
      for (int i = 0; i < 100 && ::kill(pid, 0) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivateMunged(const PrivateMunged&) = delete;
  PrivateMunged& operator=(const PrivateMunged&) = delete;

  std::string socket() const { return (dir_ / "munge.socket").string(); }
  // Freezes munged (SIGSTOP): a munged that does not answer, as an overloaded one; thaw() lets it go on.
  void freeze() { REQUIRE(::kill(pid(), SIGSTOP) == 0); }
  void thaw() { REQUIRE(::kill(pid(), SIGCONT) == 0); }

 private:
  pid_t pid() const {
    std::ifstream pid_file(dir_ / "munged.pid");
    pid_t pid = 0;
    return pid_file >> pid ? pid : 0;
  }

  std::filesystem::path dir_;
};

}  // namespace ddprun::testing
