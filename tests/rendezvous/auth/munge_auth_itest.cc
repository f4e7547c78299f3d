// The store's handshake with MUNGE credentials (MungeAuth) against real munged daemons: each test case starts
// private ones (their own key and socket, run as the munge user, as scripts/slurm-cluster.sh does), so the
// host's munge is neither needed nor touched. Agents of one job are admitted; another job's agent, a node of
// another cluster (another MUNGE key), another user's credential and a replayed credential are refused, and
// the reason says which. Needs root (munged runs as the munge user) and munged (scripts/install-deps.sh).
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "rendezvous/auth/munge_auth.h"
#include "rendezvous/store/hostile_fixture.h"

using namespace ddprun::rdzv;
using namespace ddprun::rdzv::hostile;
namespace fs = std::filesystem;

namespace {

const char* const kJob = "Slurm job 4242, run train";

// A munged of its own in a fresh directory; stopped and removed by the destructor.
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
    for (const fs::path& p : {dir_, dir_ / "munge.key"})
      REQUIRE(::chown(p.c_str(), munge->pw_uid, munge->pw_gid) == 0);
    ::chmod(dir_.c_str(), 0755);  // every client reaches the socket
    ::chmod((dir_ / "munge.key").c_str(), 0400);
    const std::string d = dir_.string();
    const std::string command =
        "runuser -u munge -- munged --key-file=" + d + "/munge.key --socket=" + socket() +
        " --pid-file=" + d + "/munged.pid --log-file=" + d + "/munged.log --seed-file=" + d + "/munged.seed";
    INFO("munged did not start: see " << d << "/munged.log");
    REQUIRE(std::system(command.c_str()) == 0);
    REQUIRE(ddprun::testing::eventually([&] { return MungeAuth(socket(), kJob).check().empty(); }));
  }
  ~PrivateMunged() {
    std::ifstream pid_file(dir_ / "munged.pid");
    if (pid_t pid = 0; pid_file >> pid && pid > 0) {
      ::kill(pid, SIGTERM);
      for (int i = 0; i < 100 && ::kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(20ms);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  PrivateMunged(const PrivateMunged&) = delete;
  PrivateMunged& operator=(const PrivateMunged&) = delete;

  std::string socket() const { return (dir_ / "munge.socket").string(); }

 private:
  fs::path dir_;
};

bool can_run_munged() {
  if (::geteuid() != 0) {
    WARN("skipped: munged must run as the munge user, which needs root");
    return false;
  }
  return true;
}

StoreClientOptions with(std::shared_ptr<const StoreAuth> auth) {
  StoreClientOptions o = client_options(Dialect::kModern);
  o.auth = std::move(auth);
  return o;
}

// A credential for `role` over the nonces made by another user (uid 65534, nobody) through `socket`.
std::string credential_of_nobody(const std::string& socket, const std::string& role,
                                 const std::string& client_nonce, const std::string& store_nonce) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    std::string cred;
    if (::setresgid(65534, 65534, 65534) == 0 && ::setresuid(65534, 65534, 65534) == 0) {
      try {
        cred = MungeAuth(socket, kJob).proof(role, client_nonce, store_nonce);
      } catch (...) {
      }
    }
    if (::write(fds[1], cred.data(), cred.size()) < 0) _exit(2);
    _exit(0);
  }
  ::close(fds[1]);
  std::string cred;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) cred.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE_FALSE(cred.empty());
  return cred;
}

// AUTH phase 1 by hand: the store's nonce (its proof is read and ignored, as an attacker would).
std::string raw_phase1(RawSocket& s, const std::string& client_nonce) {
  REQUIRE(s.send(encoded(Dialect::kModern, Request{.op = Op::kAuth, .values = {client_nonce}, .number = 1})));
  std::string nonce;
  for (int part = 0; part < 2; ++part) {
    const std::string head = s.read(8);
    REQUIRE(head.size() == 8);
    uint64_t len = 0;
    std::memcpy(&len, head.data(), 8);
    const std::string value = s.read(len);
    if (part == 0) nonce = value;
  }
  return nonce;
}

}  // namespace

TEST_CASE("munge auth: agents of one job authenticate through munged; other jobs are refused",
          "[store][auth][munge]") {
  if (!can_run_munged()) return;
  PrivateMunged munged;
  auto auth = std::make_shared<MungeAuth>(munged.socket(), kJob);
  StoreServerThread server(StoreServerOptions{.auth = auth});

  StoreClient agent("127.0.0.1", server.port(), with(std::make_shared<MungeAuth>(munged.socket(), kJob)));
  agent.set("ddprun/job/status/n", "1");
  CHECK(agent.get("ddprun/job/status/n") == "1");

  CHECK_THROWS_WITH(
      StoreClient("127.0.0.1", server.port(),
                  with(std::make_shared<MungeAuth>(munged.socket(), "Slurm job 4243, run train"))),
      Catch::Contains("made for another job or another connection"));
  // Without a credential: a worker's client on this host may touch the workers' keys only.
  StoreClient worker("127.0.0.1", server.port(), client_options(Dialect::kModern));
  CHECK_THROWS_AS(worker.get("ddprun/job/status/n"), StoreError);
  CHECK(server.stats().unauthorized >= 1);
  CHECK(agent.get("ddprun/job/status/n") == "1");
}

TEST_CASE("munge auth: a node of another cluster (another MUNGE key) is refused", "[store][auth][munge]") {
  if (!can_run_munged()) return;
  PrivateMunged ours, theirs;
  StoreServerThread server(StoreServerOptions{.auth = std::make_shared<MungeAuth>(ours.socket(), kJob)});
  CHECK_THROWS_WITH(
      StoreClient("127.0.0.1", server.port(), with(std::make_shared<MungeAuth>(theirs.socket(), kJob))),
      Catch::Contains("another MUNGE key"));
}

TEST_CASE("munge auth: another user's credential and a replayed one are refused", "[store][auth][munge]") {
  if (!can_run_munged()) return;
  PrivateMunged munged;
  const MungeAuth store(munged.socket(), kJob);
  const std::string cn = store.nonce(), sn = store.nonce();
  std::string why;

  const std::string nobodys = credential_of_nobody(munged.socket(), "agent", cn, sn);
  CHECK_FALSE(store.verify("agent", cn, sn, nobodys, why));
  CHECK_THAT(why, Catch::Contains("of uid 65534, not of the job's user (uid 0)"));

  const std::string ours = store.proof("agent", cn, sn);
  CHECK(store.verify("agent", cn, sn, ours, why));
  CHECK_FALSE(store.verify("agent", cn, sn, ours, why));
  CHECK_THAT(why, Catch::Contains("eplayed"));
  CHECK_FALSE(store.verify("store", cn, sn, store.proof("agent", cn, sn), why));  // the other role's
  CHECK_THAT(why, Catch::Contains("another job or another connection"));

  // Over the wire: the store closes the connection on nobody's credential and counts the refusal.
  StoreServerThread server(StoreServerOptions{.auth = std::make_shared<MungeAuth>(munged.socket(), kJob)});
  RawSocket s(server.port());
  const std::string client_nonce = store.nonce();
  const std::string store_nonce = raw_phase1(s, client_nonce);
  const std::string cred = credential_of_nobody(munged.socket(), "agent", client_nonce, store_nonce);
  s.send(encoded(Dialect::kModern, Request{.op = Op::kAuth, .values = {cred}, .number = 2}));
  CHECK(s.read(1).empty());
  CHECK(ddprun::testing::eventually([&] { return server.stats().unauthorized == 1; }));
}

TEST_CASE("munge auth: munged not answering is said, naming the socket", "[store][auth][munge]") {
  const MungeAuth auth("/nonexistent/munge.socket", kJob);
  CHECK_THAT(auth.check(), Catch::Contains("/nonexistent/munge.socket"));
  CHECK_THROWS_WITH(auth.proof("agent", auth.nonce(), auth.nonce()), Catch::Contains("made no credential"));
}

TEST_CASE("munge auth: the socket from slurm.conf's AuthInfo", "[store][auth][munge]") {
  const fs::path dir = fs::temp_directory_path() / ("ddprun-slurmconf-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "a.conf")
      << "ClusterName=x\n# AuthInfo=socket=/commented\nauthinfo = socket=/run/alt.socket,ttl=60\n";
  std::ofstream(dir / "b.conf") << "AuthType=auth/munge\n";
  CHECK(slurm_munge_socket(dir / "a.conf") == "/run/alt.socket");
  CHECK(slurm_munge_socket(dir / "b.conf").empty());
  CHECK(slurm_munge_socket(dir / "missing.conf").empty());
  fs::remove_all(dir);
}
