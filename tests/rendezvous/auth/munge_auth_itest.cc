// The store's handshake with MUNGE credentials (MungeAuth) against real munged daemons: each test case starts
// private ones (private_munged.h), so the host's munge is neither needed nor touched. Agents of one job are
// admitted; another job's agent, a node of another cluster (another MUNGE key), another user's credential and
// a replayed credential are refused, and the reason says which. A munged that does not answer stalls no other
// client of the store (its steps run off the store's thread); --rdzv_auth auto's agents follow the store's
// host; a long --rdzv_id fits; libmunge missing is said. Needs root (munged runs as the munge user) and
// munged (scripts/install-deps.sh).
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
#include "rendezvous/auth/munge_library.h"
#include "rendezvous/store/hostile_fixture.h"
#include "tests/rendezvous/auth/private_munged.h"

using namespace ddprun::rdzv;
using namespace ddprun::rdzv::hostile;
using ddprun::testing::can_run_munged;
using ddprun::testing::PrivateMunged;
namespace fs = std::filesystem;

namespace {

const char* const kJob = "Slurm job 4242, run train";

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

namespace {

std::string phase1_request() {
  return modern_hello() +
         encoded(Dialect::kModern, Request{.op = Op::kAuth, .values = {std::string(32, 'c')}, .number = 1});
}

}  // namespace

TEST_CASE("munge auth: a munged that does not answer stalls no other client of the store",
          "[store][auth][munge]") {
  if (!can_run_munged()) return;
  PrivateMunged munged;
  StoreServerThread server(StoreServerOptions{.auth = std::make_shared<MungeAuth>(munged.socket(), kJob)});
  {
    StoreClient worker("127.0.0.1", server.port(), client_options(Dialect::kModern));
    worker.set("default_pg/0", "addr");
  }
  munged.freeze();  // as an overloaded munged: every credential waits
  RawSocket waiting(server.port(), 0, 0, "127.0.0.2");
  REQUIRE(waiting.send(phase1_request()));  // the store must make its proof: munged does not answer
  // Meanwhile the job's heartbeats and WAITs (here a worker's requests) are served. With the proof made on
  // the store's thread they waited for libmunge's timeouts (the test's 3 s deadline is a bound, not a
  // measure).
  auto patient = client_options(Dialect::kModern);
  patient.connect_timeout = patient.timeout = 3s;
  StoreClient worker("127.0.0.1", server.port(), patient);
  for (int i = 0; i < 20; ++i) CHECK(worker.get("default_pg/0") == "addr");
  munged.thaw();
  const std::string head = waiting.read(8, 60s);  // the store's nonce's length: the proof was made after all
  CHECK(head == u64_bytes(StoreAuth::kNonceBytes));
  StoreClient agent("127.0.0.1", server.port(), with(std::make_shared<MungeAuth>(munged.socket(), kJob)));
  agent.set("ddprun/job/k", "v");
  CHECK(agent.get("ddprun/job/k") == "v");
}

TEST_CASE("munge auth: when the queue of authentications is full, a handshake is refused",
          "[store][auth][munge]") {
  if (!can_run_munged()) return;
  PrivateMunged munged;
  StoreServerThread server(StoreServerOptions{
      .auth = std::make_shared<MungeAuth>(munged.socket(), kJob), .auth_threads = 1, .auth_queue = 1});
  munged.freeze();
  std::vector<std::unique_ptr<RawSocket>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<RawSocket>(server.port(), 0, 0, "127.0.0.2"));
    REQUIRE(clients.back()->send(phase1_request()));
  }
  // One step runs (munged frozen), one waits: the third, or the second, is refused at once.
  REQUIRE(eventually([&] { return server.stats().handshakes_dropped >= 1; }));
  munged.thaw();
  int answered = 0, refused = 0;
  for (auto& c : clients) {
    const std::string head = c->read(8, 30s);
    (head == u64_bytes(StoreAuth::kNonceBytes) ? answered : refused) += 1;
  }
  CHECK(answered >= 1);
  CHECK(refused >= 1);
  CHECK(answered + refused == 3);
  CHECK(server.stats().handshakes_dropped == static_cast<uint64_t>(refused));
}

TEST_CASE("munge auth: a long --rdzv_id fits the proof (the job is bound by its digest)",
          "[store][auth][munge]") {
  if (!can_run_munged()) return;
  PrivateMunged munged;
  const std::string job = "Slurm job 4242, run " + std::string(8000, 'r');  // a long --rdzv_id
  StoreServerThread server(StoreServerOptions{.auth = std::make_shared<MungeAuth>(munged.socket(), job)});
  StoreClient agent("127.0.0.1", server.port(), with(std::make_shared<MungeAuth>(munged.socket(), job)));
  agent.set("ddprun/job/k", "v");
  CHECK(agent.get("ddprun/job/k") == "v");
  const MungeAuth auth(munged.socket(), job);
  CHECK(auth.proof("store", auth.nonce(), auth.nonce()).size() < StoreAuth::kMaxProofBytes / 4);
  CHECK_THROWS_WITH(
      StoreClient("127.0.0.1", server.port(), with(std::make_shared<MungeAuth>(munged.socket(), job + "x"))),
      Catch::Contains("made for another job"));
}

TEST_CASE("munge auth: under --rdzv_auth auto the agents follow the store's host", "[store][auth][munge]") {
  if (!can_run_munged()) return;
  PrivateMunged munged;
  using Use = MungeAuth::Use;
  const std::string dead = "/nonexistent/munge.socket";
  SECTION("the store's host's munged failed: its store is open, and an agent whose munged works joins it") {
    StoreServerThread server(
        StoreServerOptions{.auth = std::make_shared<MungeAuth>(dead, kJob, Use::kFollowUnchecked)});
    StoreClient agent("127.0.0.1", server.port(),
                      with(std::make_shared<MungeAuth>(munged.socket(), kJob, Use::kFollow)));
    agent.set("ddprun/job/k", "v");
    CHECK(agent.get("ddprun/job/k") == "v");
    // --rdzv_auth munge insists: an open store is refused.
    CHECK_THROWS_WITH(StoreClient("127.0.0.1", server.port(),
                                  with(std::make_shared<MungeAuth>(munged.socket(), kJob, Use::kRequired))),
                      Catch::Contains("is open but this agent proves"));
  }
  SECTION("the store requires MUNGE: a node whose munged failed at its start checks it again, and proves") {
    StoreServerThread server(
        StoreServerOptions{.auth = std::make_shared<MungeAuth>(munged.socket(), kJob, Use::kFollow)});
    StoreClient agent("127.0.0.1", server.port(),
                      with(std::make_shared<MungeAuth>(munged.socket(), kJob, Use::kFollowUnchecked)));
    agent.set("ddprun/job/k", "v");
    CHECK(agent.get("ddprun/job/k") == "v");
  }
  SECTION("the store requires MUNGE and this node's munged stays silent: one clear message") {
    StoreServerThread server(
        StoreServerOptions{.auth = std::make_shared<MungeAuth>(munged.socket(), kJob, Use::kFollow)});
    CHECK_THROWS_WITH(
        StoreClient("127.0.0.1", server.port(),
                    with(std::make_shared<MungeAuth>(dead, kJob, Use::kFollowUnchecked, 1200ms))),
        Catch::Contains("requires a MUNGE credential") && Catch::Contains("its host decided so") &&
            Catch::Contains(dead) && Catch::Contains("checked") &&
            Catch::Contains("start munged on this node"));
  }
}

TEST_CASE("munge auth: libmunge that cannot be loaded is said, with what to do", "[store][auth][munge]") {
  std::string why;
  CHECK_FALSE(load_munge_library("libmunge-that-is-not-there.so.2", why));
  CHECK_THAT(why, Catch::Contains("libmunge cannot be loaded") &&
                      Catch::Contains("libmunge-that-is-not-there.so.2") &&
                      Catch::Contains("--rdzv_secret_file"));
  CHECK_FALSE(load_munge_library("libc.so.6", why));  // a library, but not libmunge
  CHECK_THAT(why, Catch::Contains("is not libmunge") && Catch::Contains("munge_encode"));
}
