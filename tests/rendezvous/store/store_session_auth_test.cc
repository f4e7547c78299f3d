// StoreSession with a StoreAuth, byte by byte: the AUTH handshake run inline and handed out (a blocking auth,
// as MUNGE's, whose steps the server runs off its thread), the observer's role, admission latched per
// connection, what establishes a session, and what a store does without random bytes. The auth is a test
// double: its proof is the role's first letter and the nonces' first bytes (rendezvous/auth/ has the real
// ones).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/key_value_state.h"
#include "rendezvous/store/store_session.h"
#include "rendezvous/store/wire_codec.h"
#include "tests/rendezvous/store/session_client.h"

namespace ddprun::rdzv {
namespace {

using Catch::Contains;
using namespace ddprun::rdzv::session_testing;

class TestAuth final : public StoreAuth {
 public:
  bool blocking = false;
  bool requires_proof = true;
  std::string nonce_bytes = std::string(kNonceBytes, 'S');
  std::string nonce() const noexcept override { return nonce_bytes; }
  std::string proof(std::string_view role, std::string_view client_nonce,
                    std::string_view store_nonce) const override {
    return std::string(role.substr(0, 1)) + std::string(client_nonce.substr(0, 2)) +
           std::string(store_nonce.substr(0, 2));
  }
  bool verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
              std::string_view given, std::string& why) const noexcept override {
    if (given == proof(role, client_nonce, store_nonce)) return true;
    why = "a wrong test proof";
    return false;
  }
  std::string what() const override { return "the test's secret"; }
  bool blocks() const noexcept override { return blocking; }
  bool store_requires() const noexcept override { return requires_proof; }
};

const std::string kClientNonce(StoreAuth::kNonceBytes, 'C');

Request auth_request(uint32_t phase, std::string value) {
  Request r;
  r.op = Op::kAuth;
  r.number = phase;
  r.values = {std::move(value)};
  return r;
}

// A session of a store with `auth`, whose address is admitted while `*admitted` says so.
struct Stranger {
  Stranger(KeyValueState& state, std::shared_ptr<TestAuth> a, std::shared_ptr<bool> admitted)
      : auth(std::move(a)), client(state, Dialect::kModern) {
    client.session().set_admission({.auth = auth,
                                    .peer_admitted = [admitted] { return *admitted; },
                                    .on_authenticated = [this] { ++agents; }});
  }
  // Feeds `bytes`; the result of consume().
  StoreSession::ConsumeResult feed(const std::string& bytes) {
    return client.session().consume(span_of(bytes));
  }

  std::shared_ptr<TestAuth> auth;
  Client client;
  int agents = 0;
};

TEST_CASE("session auth: a blocking AUTH step is handed out, and what followed it is handled after",
          "[store_session][auth]") {
  KeyValueState state;
  auto auth = std::make_shared<TestAuth>();
  auth->blocking = true;
  Stranger s(state, auth, std::make_shared<bool>(false));
  const std::string ping = encode(Dialect::kModern, numbered(Op::kPing, 7));
  // PING, AUTH phase 1 and another PING in one read: the session stops right after the AUTH.
  const std::string phase1 = encode(Dialect::kModern, auth_request(1, kClientNonce));
  auto r = s.feed(ping + phase1 + ping);
  REQUIRE(r.error.empty());
  REQUIRE(r.auth_pending);
  CHECK(r.consumed == ping.size() + phase1.size());
  CHECK(r.requests == 2);
  CHECK(s.feed(ping).consumed == 0);  // nothing more is handled while the step is out
  // The step carries what it needs (it runs on another thread); its outcome comes back.
  const StoreSession::AuthStep step = s.client.session().take_auth_step();
  CHECK(step.phase == 1);
  CHECK(step.client_nonce == kClientNonce);
  REQUIRE(s.client.session().finish_auth(step.run()).error.empty());
  {
    Reply reply(s.client.take());
    CHECK(reply.u32() == 7);
    CHECK(reply.bytes() == auth->nonce_bytes);
    CHECK(reply.bytes() == "sCCSS");  // the store's proof, made by the step
  }
  REQUIRE(s.feed(ping).error.empty());  // the bytes after it
  CHECK(Reply(s.client.take()).u32() == 7);
  // Phase 2 the same way; the session is an agent's once its outcome is back.
  r = s.feed(encode(Dialect::kModern, auth_request(2, "aCCSS")));
  REQUIRE(r.auth_pending);
  CHECK_FALSE(s.client.session().authenticated());
  REQUIRE(s.client.session().finish_auth(s.client.session().take_auth_step().run()).error.empty());
  CHECK(Reply(s.client.take()).u8() == 1);
  CHECK(s.client.session().agent());
  CHECK(s.agents == 1);
  s.client.call(req(Op::kSet, {"/ddprun/job/r0/stop"}, {"x"}));
  CHECK(state.get("/ddprun/job/r0/stop") != nullptr);
}

TEST_CASE("session auth: a wrong proof refused through a blocking step is a refusal",
          "[store_session][auth]") {
  KeyValueState state;
  auto auth = std::make_shared<TestAuth>();
  auth->blocking = true;
  Stranger s(state, auth, std::make_shared<bool>(false));
  REQUIRE(s.feed(encode(Dialect::kModern, auth_request(1, kClientNonce))).auth_pending);
  REQUIRE(s.client.session().finish_auth(s.client.session().take_auth_step().run()).error.empty());
  s.client.take();
  REQUIRE(s.feed(encode(Dialect::kModern, auth_request(2, "wrong"))).auth_pending);
  auto done = s.client.session().finish_auth(s.client.session().take_auth_step().run());
  CHECK(done.refused);
  CHECK_THAT(done.error, Contains("refused AUTH") && Contains("a wrong test proof"));
  CHECK(s.agents == 0);
}

TEST_CASE("session auth: an observer reads the job's keys, writes none and admits nobody",
          "[store_session][auth]") {
  KeyValueState state;
  state.set("/ddprun/job/status/n", "2");
  state.set("/ddprun/job/status/index/0", "h1:7");
  Stranger s(state, std::make_shared<TestAuth>(), std::make_shared<bool>(false));
  REQUIRE(s.feed(encode(Dialect::kModern, auth_request(1, kClientNonce))).error.empty());
  s.client.take();
  REQUIRE(s.feed(encode(Dialect::kModern, auth_request(3, "oCCSS"))).error.empty());  // the observer's proof
  CHECK(Reply(s.client.take()).u8() == 1);
  CHECK(s.client.session().authenticated());
  CHECK_FALSE(s.client.session().agent());
  CHECK(s.agents == 0);  // its address is not admitted for it
  CHECK(get_value(s.client, "/ddprun/job/status/index/0") == "h1:7");
  CHECK(has_key(s.client, "/ddprun/job/status/n"));
  // ADD 0 is how a counter is read: served, and a missing counter is 0 and stays missing.
  CHECK(Reply(s.client.call(add_req("/ddprun/job/status/n", 0))).i64() == 2);
  CHECK(Reply(s.client.call(add_req("/ddprun/job/missing", 0))).i64() == 0);
  CHECK(state.get("/ddprun/job/missing") == nullptr);
  for (const Request& write :
       {req(Op::kSet, {"/ddprun/job/r0/stop"}, {"x"}), add_req("/ddprun/job/r1/joined", 1),
        req(Op::kDeleteKey, {"/ddprun/job/status/n"}), req(Op::kSet, {"worker"}, {"x"})}) {
    CAPTURE(op_name(write.op));
    Stranger o(state, std::make_shared<TestAuth>(), std::make_shared<bool>(false));
    REQUIRE(o.feed(encode(Dialect::kModern, auth_request(1, kClientNonce))).error.empty());
    REQUIRE(o.feed(encode(Dialect::kModern, auth_request(3, "oCCSS"))).error.empty());
    auto r = o.feed(encode(Dialect::kModern, write));
    CHECK(r.refused);
    CHECK_THAT(r.error,
               Contains("an observer (ddprun status) proved the job's secret to read, not to write"));
  }
  CHECK(state.num_keys() == 2);
  // An agent's proof is not an observer's, nor the other way round.
  Stranger wrong(state, std::make_shared<TestAuth>(), std::make_shared<bool>(false));
  REQUIRE(wrong.feed(encode(Dialect::kModern, auth_request(1, kClientNonce))).error.empty());
  CHECK(wrong.feed(encode(Dialect::kModern, auth_request(3, "aCCSS"))).refused);
}

TEST_CASE("session auth: admission is latched: a worker stays served when its node's agents reconnect",
          "[store_session][auth]") {
  KeyValueState state;
  auto admitted = std::make_shared<bool>(true);  // an agent of the worker's host is connected
  Stranger worker(state, std::make_shared<TestAuth>(), admitted);
  worker.client.call(req(Op::kSet, {"default_pg/0"}, {"addr"}));
  *admitted = false;  // its agent's connections are gone for a moment
  CHECK(get_value(worker.client, "default_pg/0") == "addr");
  worker.client.call(req(Op::kSet, {"default_pg/1"}, {"addr"}));
  // Latched for worker keys only: the job's keys still need an agent.
  auto r = worker.feed(encode(Dialect::kModern, req(Op::kGet, {"/ddprun/job/r0/stop"})));
  CHECK(r.refused);
  // A connection that was never served from that address is refused while it is not admitted.
  Stranger late(state, std::make_shared<TestAuth>(), admitted);
  CHECK(late.feed(encode(Dialect::kModern, req(Op::kGet, {"default_pg/0"}))).refused);
}

TEST_CASE("session auth: VALIDATE, PING and AUTH phase 1 do not establish a session; a request served does",
          "[store_session][auth]") {
  KeyValueState state;
  auto admitted = std::make_shared<bool>(false);
  Stranger s(state, std::make_shared<TestAuth>(), admitted);
  REQUIRE(s.feed(encode(Dialect::kModern, numbered(Op::kValidate, kValidationMagic)) +
                 encode(Dialect::kModern, numbered(Op::kPing, 1)) +
                 encode(Dialect::kModern, auth_request(1, kClientNonce)))
              .error.empty());
  CHECK_FALSE(s.client.session().established());
  REQUIRE(s.feed(encode(Dialect::kModern, auth_request(2, "aCCSS"))).error.empty());
  CHECK(s.client.session().established());

  *admitted = true;
  Stranger worker(state, std::make_shared<TestAuth>(), admitted);
  worker.client.call(numbered(Op::kPing, 1));
  CHECK_FALSE(worker.client.session().established());
  worker.client.call(req(Op::kGet, {"k"}));
  CHECK(worker.client.session().established());

  Client open(state, Dialect::kModern);  // an open store: the same rule
  open.call(numbered(Op::kPing, 1));
  CHECK_FALSE(open.session().established());
  open.call(req(Op::kCheck, {"k"}));
  CHECK(open.session().established());
}

TEST_CASE("session auth: without random bytes the store refuses AUTH, saying why", "[store_session][auth]") {
  KeyValueState state;
  auto auth = std::make_shared<TestAuth>();
  auth->nonce_bytes.clear();  // StoreAuth::nonce() had no random bytes
  Stranger s(state, auth, std::make_shared<bool>(false));
  auto r = s.feed(encode(Dialect::kModern, auth_request(1, kClientNonce)));
  CHECK(r.refused);
  CHECK_THAT(r.error, Contains("no random bytes"));
}

TEST_CASE("session auth: an auth that does not require its proof makes an open store",
          "[store_session][auth]") {
  KeyValueState state;
  auto auth = std::make_shared<TestAuth>();
  auth->requires_proof = false;  // MUNGE under auto on a store host whose munged failed
  Stranger s(state, auth, std::make_shared<bool>(false));
  Reply phase1(s.client.call(auth_request(1, kClientNonce)));
  CHECK(phase1.bytes().empty());  // an open store's answer: two empty values
  CHECK(phase1.bytes().empty());
  s.client.call(req(Op::kSet, {"/ddprun/job/r0/stop"}, {"x"}));  // served, as an open store serves it
  CHECK(state.get("/ddprun/job/r0/stop") != nullptr);
}

}  // namespace
}  // namespace ddprun::rdzv
