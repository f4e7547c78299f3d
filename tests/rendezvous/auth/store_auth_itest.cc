// The store's admission with a secret (store_auth.h, StoreSession's admission, HmacAuth) over real sockets:
// agents that prove the secret, clients that do not, from the store's own host (127.0.0.1) and from a
// stranger (127.0.0.2, another loopback address: not one of the host's interface addresses); and the secret
// file.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "rendezvous/auth/hmac_auth.h"
#include "rendezvous/store/hostile_fixture.h"

using namespace ddprun::rdzv;
using namespace ddprun::rdzv::hostile;

namespace {

const std::string kStop = "ddprun/job/r0/stop";  // an agent key: the round's stop

std::shared_ptr<const StoreAuth> secret(const std::string& s) {
  return std::make_shared<HmacAuth>(s);
}

StoreClientOptions with(std::shared_ptr<const StoreAuth> auth) {
  StoreClientOptions o = client_options(Dialect::kModern);
  o.auth = std::move(auth);
  return o;
}

struct SecretStore {
  SecretStore() : server(StoreServerOptions{.auth = secret("the-job-secret-0123456789")}) {}
  StoreServerThread server;
  uint16_t port() { return server.port(); }
};

// AUTH phase 1 and 2 by hand on `s` with `auth`; true when the store answered phase 2 with 1.
bool raw_authenticate(RawSocket& s, const StoreAuth& auth) {
  const std::string nonce = auth.nonce();
  REQUIRE(s.send(modern_hello() +
                 encoded(Dialect::kModern, Request{.op = Op::kAuth, .values = {nonce}, .number = 1})));
  std::string head = s.read(8);
  REQUIRE(head.size() == 8);
  uint64_t len = 0;
  std::memcpy(&len, head.data(), 8);
  const std::string store_nonce = s.read(len);
  head = s.read(8);
  std::memcpy(&len, head.data(), 8);
  const std::string store_proof = s.read(len);
  std::string why;
  CHECK(auth.verify("store", nonce, store_nonce, store_proof, why));
  REQUIRE(s.send(
      encoded(Dialect::kModern,
              Request{.op = Op::kAuth, .values = {auth.proof("agent", nonce, store_nonce)}, .number = 2})));
  return s.read(1) == std::string(1, '\x01');
}

std::string get_request(const std::string& key) {
  return encoded(Dialect::kModern, Request{.op = Op::kGet, .keys = {key}});
}

}  // namespace

TEST_CASE("store auth: an agent with the secret does everything; without it, worker keys only",
          "[store][auth]") {
  SecretStore s;
  StoreClient agent("127.0.0.1", s.port(), with(secret("the-job-secret-0123456789")));
  agent.set("ddprun/job/status/n", "1");
  CHECK(agent.get("ddprun/job/status/n") == "1");

  // A torch client on the store's own host (a worker of node 0): its keys, not the job's.
  StoreClient worker("127.0.0.1", s.port(), client_options(Dialect::kModern));
  worker.set("default_pg/0", "addr");
  CHECK(worker.get("default_pg/0") == "addr");
  worker.set(kStop, "a stranger's stop");  // SET has no reply: refused, the connection closed
  CHECK_THROWS_AS(worker.get("default_pg/0"), StoreError);
  CHECK_FALSE(agent.check({kStop}));
  CHECK(s.server.stats().unauthorized == 1);

  StoreClient reader("127.0.0.1", s.port(), client_options(Dialect::kModern));
  CHECK_THROWS_AS(reader.get("ddprun/job/status/n"), StoreError);  // reading the job's keys: refused too
}

TEST_CASE("store auth: wrong secrets are refused both ways, and an open store by an agent with a secret",
          "[store][auth]") {
  SecretStore s;
  CHECK_THROWS_WITH(StoreClient("127.0.0.1", s.port(), with(secret("another-jobs-secret-98765"))),
                    Catch::Contains("is not this job's: a wrong proof"));

  // The store's side: a client that sends a wrong proof is closed.
  RawSocket raw(s.port());
  const std::string nonce(StoreAuth::kNonceBytes, 'n');
  REQUIRE(raw.send(modern_hello() +
                   encoded(Dialect::kModern, Request{.op = Op::kAuth, .values = {nonce}, .number = 1})));
  CHECK(raw.read(2 * (8 + 32)).size() == 80);  // the store's nonce and proof
  REQUIRE(raw.send(
      encoded(Dialect::kModern, Request{.op = Op::kAuth, .values = {std::string(32, 'x')}, .number = 2})));
  CHECK(raw.wait_closed());
  CHECK(s.server.stats().unauthorized == 1);

  StoreServerThread open(StoreServerOptions{});
  CHECK_THROWS_WITH(StoreClient("127.0.0.1", open.port(), with(secret("the-job-secret-0123456789"))),
                    Catch::Contains("is open but this agent proves"));
  StoreClient torch_like("127.0.0.1", open.port(), client_options(Dialect::kModern));
  torch_like.set(kStop, "open");  // an open store serves everyone, as torch's does
  CHECK(torch_like.get(kStop) == "open");
}

TEST_CASE("store auth: a stranger's address is served nothing until an agent of its host proved the secret",
          "[store][auth]") {
  SecretStore s;
  {
    StoreClient agent("127.0.0.1", s.port(), with(secret("the-job-secret-0123456789")));
    agent.set("worker_key", "w");
  }
  RawSocket stranger(s.port(), 0, 0, "127.0.0.2");
  REQUIRE(stranger.send(modern_hello() + get_request("/worker_key")));
  CHECK(stranger.wait_closed());

  // An agent on 127.0.0.2 proves the secret: its host's workers are admitted while it stays connected.
  auto agent = std::make_unique<RawSocket>(s.port(), 0, 0, "127.0.0.2");
  HmacAuth auth("the-job-secret-0123456789");
  REQUIRE(raw_authenticate(*agent, auth));
  {
    RawSocket worker(s.port(), 0, 0, "127.0.0.2");
    REQUIRE(worker.send(modern_hello() + get_request("/worker_key")));
    CHECK(worker.read(9) == u64_bytes(1) + "w");
    REQUIRE(worker.send(get_request("/" + kStop)));  // its keys only
    CHECK(worker.wait_closed());
  }
  agent.reset();
  eventually([&] {
    RawSocket late(s.port(), 0, 0, "127.0.0.2");
    late.send(modern_hello() + get_request("/worker_key"));
    return late.wait_closed(2s);
  });
  CHECK(s.server.stats().unauthorized >= 3);
}

TEST_CASE("the secret file: trimmed, at least 16 bytes, a warning when others may read it", "[auth]") {
  const auto dir = std::filesystem::temp_directory_path() / ("ddprun-secret-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string warning;
  CHECK_THROWS_WITH(read_secret_file(dir / "missing", warning),
                    Catch::Contains((dir / "missing").string()) && Catch::Contains("openssl rand -hex 32"));
  std::ofstream(dir / "short") << "tooshort\n";
  CHECK_THROWS_WITH(read_secret_file(dir / "short", warning),
                    Catch::Contains("holds 8 bytes, fewer than 16"));
  std::ofstream(dir / "good") << "  0123456789abcdef0123\n";
  ::chmod((dir / "good").c_str(), 0600);
  CHECK(read_secret_file(dir / "good", warning) == "0123456789abcdef0123");
  CHECK(warning.empty());
  ::chmod((dir / "good").c_str(), 0644);
  read_secret_file(dir / "good", warning);
  CHECK_THAT(warning, Catch::Contains("may be read by other users"));
  std::filesystem::remove_all(dir);
}
