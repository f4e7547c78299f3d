// The store's admission with a secret (store_auth.h, StoreSession's admission, HmacAuth) over real sockets:
// agents that prove the secret, clients that do not, from the store's own host (127.0.0.1) and from a
// stranger (127.0.0.2, another loopback address: not one of the host's interface addresses); and the secret
// file.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

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
  explicit SecretStore(StoreServerOptions options = {}) : server(with_secret(std::move(options))) {}
  static StoreServerOptions with_secret(StoreServerOptions o) {
    o.auth = secret("the-job-secret-0123456789");
    return o;
  }
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

TEST_CASE(
    "store auth: strangers that never authenticate cannot hold the connection limit: an agent still joins",
    "[store][auth]") {
  // The review's attack: connections that each send one VALIDATE (or PING) and nothing more, as many as the
  // store admits. They used to count as not silent and stay open for good, refusing every newcomer.
  SecretStore s(StoreServerOptions{.max_connections = 30, .handshake_timeout = 60s});
  std::vector<std::unique_ptr<RawSocket>> flood;
  for (int i = 0; i < 40; ++i) {
    flood.push_back(std::make_unique<RawSocket>(s.port(), 0, 0, "127.0.0.2"));
    const std::string ping = encoded(Dialect::kModern, Request{.op = Op::kPing, .number = 1});
    REQUIRE(flood.back()->send(modern_hello() + (i % 2 ? ping : "")));
  }
  REQUIRE(eventually([&] { return s.server.stats().connections == 30; }));
  // A new agent (and its workers' host with it) joins at once: the oldest stranger makes room.
  StoreClient agent("127.0.0.1", s.port(), with(secret("the-job-secret-0123456789")));
  agent.set("ddprun/job/r0/joined", "1");
  CHECK(agent.get("ddprun/job/r0/joined") == "1");
  StoreClient worker("127.0.0.1", s.port(), client_options(Dialect::kModern));
  worker.set("default_pg/0", "addr");
  CHECK(s.server.stats().refused == 0);
  CHECK(s.server.stats().handshakes_dropped >= 12);  // 10 newcomers of the flood, the agent, the worker
  CHECK(agent.get("default_pg/0") == "addr");
}

TEST_CASE("store auth: a stranger that does not authenticate within the handshake timeout is closed",
          "[store][auth]") {
  SecretStore s(StoreServerOptions{.handshake_timeout = 300ms});
  RawSocket pinger(s.port(), 0, 0, "127.0.0.2");
  REQUIRE(pinger.send(modern_hello() + encoded(Dialect::kModern, Request{.op = Op::kPing, .number = 5})));
  CHECK(pinger.read(4) == std::string("\x05\0\0\0", 4));  // served its PING, then closed at the deadline
  CHECK(pinger.wait_closed());
  RawSocket half(s.port(), 0, 0, "127.0.0.2");  // AUTH phase 1, never phase 2
  REQUIRE(half.send(
      modern_hello() +
      encoded(Dialect::kModern, Request{.op = Op::kAuth, .values = {std::string(32, 'n')}, .number = 1})));
  CHECK(half.wait_closed());
  CHECK(s.server.stats().handshakes_dropped == 2);
  // An agent that authenticates in time stays, and so does a worker of the store's own host (admitted).
  StoreClient agent("127.0.0.2", s.port(), with(secret("the-job-secret-0123456789")));
  RawSocket idle_worker(s.port());
  REQUIRE(idle_worker.send(modern_hello()));
  CHECK_FALSE(idle_worker.wait_closed(1s));
  agent.set("ddprun/job/k", "v");
  CHECK(agent.get("ddprun/job/k") == "v");
}

TEST_CASE("store auth: at most max_handshakes_per_address strangers of one address wait to authenticate",
          "[store][auth]") {
  SecretStore s(StoreServerOptions{.handshake_timeout = 60s, .max_handshakes_per_address = 4});
  std::vector<std::unique_ptr<RawSocket>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawSocket>(s.port(), 0, 0, "127.0.0.2"));
    REQUIRE(held.back()->send(modern_hello()));
  }
  REQUIRE(eventually([&] { return s.server.stats().connections == 4; }));
  RawSocket fifth(s.port(), 0, 0, "127.0.0.2");
  CHECK(fifth.wait_closed(5s));  // closed at accept
  CHECK(s.server.stats().handshakes_dropped == 1);
  // Another address, and the job's own, are not held back by it.
  RawSocket other(s.port(), 0, 0, "127.0.0.3");
  REQUIRE(other.send(modern_hello() + encoded(Dialect::kModern, Request{.op = Op::kPing, .number = 9})));
  CHECK(other.read(4) == std::string("\x09\0\0\0", 4));
  StoreClient agent("127.0.0.1", s.port(), with(secret("the-job-secret-0123456789")));
  // One of the four leaves: its address may try again.
  held.pop_back();
  REQUIRE(eventually([&] {
    RawSocket again(s.port(), 0, 0, "127.0.0.2");
    return again.send(modern_hello() + encoded(Dialect::kModern, Request{.op = Op::kPing, .number = 3})) &&
           again.read(4) == std::string("\x03\0\0\0", 4);
  }));
}

TEST_CASE("store auth: a worker's connection stays admitted while its node's agent reconnects",
          "[store][auth]") {
  SecretStore s;
  auto agent = std::make_unique<RawSocket>(s.port(), 0, 0, "127.0.0.2");
  HmacAuth auth("the-job-secret-0123456789");
  REQUIRE(raw_authenticate(*agent, auth));
  RawSocket worker(s.port(), 0, 0, "127.0.0.2");
  REQUIRE(worker.send(
      modern_hello() +
      encoded(Dialect::kModern, Request{.op = Op::kSet, .keys = {"/default_pg/0"}, .values = {"addr"}})));
  REQUIRE(worker.send(get_request("/default_pg/0")));
  REQUIRE(worker.read(12) == u64_bytes(4) + "addr");
  agent.reset();  // the agent's connection is gone for a moment (it reconnects, or the store is busy)
  REQUIRE(eventually([&] {  // the address is no longer admitted: a new connection from it is refused
    RawSocket late(s.port(), 0, 0, "127.0.0.2");
    late.send(modern_hello() + get_request("/default_pg/0"));
    return late.wait_closed(2s);
  }));
  // The worker's connection, admitted once, is still served.
  REQUIRE(worker.send(get_request("/default_pg/0")));
  CHECK(worker.read(12) == u64_bytes(4) + "addr");
}

TEST_CASE(
    "store auth: ddprun status proves the secret as an observer: it reads, writes nothing, admits nobody",
    "[store][auth]") {
  SecretStore s;
  StoreClient agent("127.0.0.1", s.port(), with(secret("the-job-secret-0123456789")));
  agent.set("ddprun/job/status/n", "1");
  agent.set("default_pg/0", "addr");
  StoreClientOptions as_observer = with(secret("the-job-secret-0123456789"));
  as_observer.observer = true;
  StoreClient status("127.0.0.2", s.port(), as_observer);
  CHECK(status.get("ddprun/job/status/n") == "1");
  CHECK(status.check({"ddprun/job/status/n"}));
  CHECK(status.add("ddprun/job/status/n", 0) == 1);
  // Its host is not admitted for it: a worker's client there is refused.
  RawSocket stranger_worker(s.port(), 0, 0, "127.0.0.2");
  REQUIRE(stranger_worker.send(modern_hello() + get_request("/default_pg/0")));
  CHECK(stranger_worker.wait_closed());
  // It writes nothing: a SET closes its connection, and the key is unchanged.
  status.set("ddprun/job/r0/stop", "observer");
  CHECK_THROWS_AS(status.get("ddprun/job/status/n"), StoreError);
  CHECK_FALSE(agent.check({"ddprun/job/r0/stop"}));
}

TEST_CASE("store auth: an AUTH value past 4 KiB is refused on its length, before it is buffered",
          "[store][auth]") {
  SecretStore s(StoreServerOptions{.request_timeout = 60s});
  RawSocket raw(s.port(), 0, 0, "127.0.0.2");
  std::string header = modern_hello();
  WireWriter w(header);
  w.u8(0xDD);  // AUTH
  w.u32(1);
  w.u64(uint64_t{64} << 20);  // a 64 MiB "nonce": only its length is sent
  REQUIRE(raw.send(header));
  CHECK(raw.wait_closed(10s));  // at once, not at the 60 s request timeout
}

TEST_CASE("the secret file: trimmed, at least 16 bytes, private to its owner like an ssh key", "[auth]") {
  const auto dir = std::filesystem::temp_directory_path() / ("ddprun-secret-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  CHECK_THROWS_WITH(read_secret_file(dir / "missing"),
                    Catch::Contains((dir / "missing").string()) && Catch::Contains("openssl rand -hex 32"));
  std::ofstream(dir / "short") << "tooshort\n";
  ::chmod((dir / "short").c_str(), 0600);
  CHECK_THROWS_WITH(read_secret_file(dir / "short"), Catch::Contains("holds 8 bytes, fewer than 16"));
  std::ofstream(dir / "good") << "  0123456789abcdef0123\n";
  ::chmod((dir / "good").c_str(), 0600);
  CHECK(read_secret_file(dir / "good") == "0123456789abcdef0123");
  ::chmod((dir / "good").c_str(), 0400);
  CHECK(read_secret_file(dir / "good") == "0123456789abcdef0123");
  // Others may read it (or write it): refused, as ssh refuses such a private key (it was a warning before).
  for (mode_t open_mode : {0644, 0640, 0604, 0620}) {
    CAPTURE(open_mode);
    ::chmod((dir / "good").c_str(), open_mode);
    CHECK_THROWS_WITH(read_secret_file(dir / "good"),
                      Catch::Contains("its group or other users may read or change it") &&
                          Catch::Contains("chmod 600 " + (dir / "good").string()));
  }
  // What is checked is the file opened: a link to a private file is read, one to an open file refused.
  ::chmod((dir / "good").c_str(), 0600);
  std::filesystem::create_symlink(dir / "good", dir / "link");
  CHECK(read_secret_file(dir / "link") == "0123456789abcdef0123");
  // Not a regular file (a FIFO would block a plain open): refused at once.
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(read_secret_file(dir / "fifo"), Catch::Contains("is not a regular file"));
  std::filesystem::remove_all(dir);
}
