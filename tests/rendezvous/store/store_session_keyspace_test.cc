// Tests of StoreSession's worker keyspaces (docs/rendezvous.md, "A clean keyspace for every attempt"): each
// attempt's workers see only their own keys, and each session counts and lists keys from one view.
#include <algorithm>
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

using namespace ddprun::rdzv::session_testing;

TEST_CASE("without a worker keyspace the store is one flat keyspace", "[store_session][keyspace]") {
  KeyValueState state;
  Client a(state, Dialect::kModern), b(state, Dialect::kLegacy);
  a.call(req(Op::kSet, {"/k"}, {"v"}));
  CHECK(get_value(b, "/k") == "v");
  CHECK(state.get("/k") != nullptr);
  CHECK(state.keyspaces() == 0);
}

TEST_CASE("workers of a new attempt never see the keys of the previous one", "[store_session][keyspace]") {
  KeyValueState state;
  Client agent(state, Dialect::kModern);
  agent.call(req(Op::kSet, {"/ddprun/worker_keyspace"}, {"job/r0"}));
  Client old_worker(state, Dialect::kModern);
  old_worker.call(req(Op::kSet, {"/default_pg/rank_1"}, {"old-address"}));
  old_worker.call(add_req("init/", 1));
  // The keys are stored under the attempt's prefix, and the agents see them there.
  CHECK(state.get("/default_pg/rank_1") == nullptr);
  REQUIRE(state.get("/ddprun/ws/job/r0//default_pg/rank_1") != nullptr);

  // The next round opens a new keyspace; a straggler of the old attempt keeps its own.
  agent.call(req(Op::kSet, {"/ddprun/worker_keyspace"}, {"job/r1"}));
  Client new_worker(state, Dialect::kModern);
  CHECK_FALSE(has_key(new_worker, "/default_pg/rank_1"));
  CHECK(Reply(new_worker.call(add_req("init/", 1))).i64() == 1);
  new_worker.call(req(Op::kSet, {"/default_pg/rank_1"}, {"new-address"}));
  CHECK(get_value(old_worker, "/default_pg/rank_1") == "old-address");
  old_worker.call(req(Op::kSet, {"/late"}, {"x"}));
  CHECK_FALSE(has_key(new_worker, "/late"));
  CHECK(get_value(new_worker, "/default_pg/rank_1") == "new-address");

  // Agent keys are shared by everyone.
  new_worker.call(req(Op::kSet, {"/ddprun/job/shared"}, {"1"}));
  CHECK(get_value(old_worker, "/ddprun/job/shared") == "1");
}

TEST_CASE("a WAIT in one keyspace is not woken by a write in another", "[store_session][keyspace]") {
  KeyValueState state;
  Client agent(state, Dialect::kModern);
  agent.call(req(Op::kSet, {"/ddprun/worker_keyspace"}, {"r0"}));
  Client old_worker(state, Dialect::kModern);
  old_worker.call(req(Op::kCheck, {"/x"}));  // binds to r0
  agent.call(req(Op::kSet, {"/ddprun/worker_keyspace"}, {"r1"}));
  Client waiter(state, Dialect::kModern);
  CHECK(waiter.call(req(Op::kWait, {"/k"})).empty());
  old_worker.call(req(Op::kSet, {"/k"}, {"stale"}));
  CHECK(waiter.async() == 0);
  Client writer(state, Dialect::kModern);
  writer.call(req(Op::kSet, {"/k"}, {"fresh"}));
  CHECK(waiter.async() == 1);
  CHECK(Reply(waiter.take()).u8() == kWaitStopWaiting);
}

TEST_CASE("LIST_KEYS, GETNUMKEYS and WATCH_KEY events show keys without the prefix",
          "[store_session][keyspace]") {
  KeyValueState state;
  state.set("/ddprun/worker_keyspace", "r7");
  state.set("/ddprun/agent_only", "1");
  Client watcher(state, Dialect::kLegacy), writer(state, Dialect::kLegacy);
  watcher.call(req(Op::kWatchKey, {"/w"}));
  writer.call(req(Op::kSet, {"/w"}, {"1"}));
  Reply ev(watcher.take());
  CHECK(ev.u8() == uint8_t(WatchEvent::kKeyCreated));
  CHECK(ev.bytes() == "/w");

  Client modern(state, Dialect::kModern);
  modern.call(req(Op::kSet, {"/a"}, {"1"}));
  Reply n(modern.call(req(Op::kGetNumKeys)));
  CHECK(n.i64() == 2);
  Reply list(modern.call(req(Op::kListKeys)));
  REQUIRE(list.i64() == 2);
  std::vector<std::string> keys{list.bytes(), list.bytes()};
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"/a", "/w"});
}

TEST_CASE("a keyspace's keys are erased once no session uses it and it is no longer current",
          "[store_session][keyspace]") {
  KeyValueState state;
  state.set("/ddprun/worker_keyspace", "r0");
  auto worker = std::make_unique<Client>(state, Dialect::kModern);
  worker->call(req(Op::kSet, {"/k"}, {std::string(1000, 'x')}));
  worker->call(req(Op::kQueuePush, {"/q"}, {"item"}));
  const size_t with_keys = state.stored_bytes();
  CHECK(state.keyspaces() == 1);

  // Still current: its keys stay after the worker left (a worker may reconnect within the attempt).
  worker.reset();
  CHECK(state.get("/ddprun/ws/r0//k") != nullptr);

  // A new attempt: the old keyspace is gone, and with it its bytes.
  state.set("/ddprun/worker_keyspace", "r1");
  CHECK(state.get("/ddprun/ws/r0//k") == nullptr);
  CHECK(state.queue_len("/ddprun/ws/r0//q") == 0);
  CHECK(state.keyspaces() == 0);
  CHECK(state.stored_bytes() < with_keys - 1000);

  // A straggler keeps its old keyspace alive until it disconnects.
  auto straggler = std::make_unique<Client>(state, Dialect::kModern);
  straggler->call(req(Op::kSet, {"/s"}, {"1"}));
  state.set("/ddprun/worker_keyspace", "r2");
  CHECK(state.get("/ddprun/ws/r1//s") != nullptr);
  straggler.reset();
  CHECK(state.get("/ddprun/ws/r1//s") == nullptr);
  CHECK(state.get("/ddprun/worker_keyspace") != nullptr);
}

int64_t num_keys(Client& c) {
  return Reply(c.call(req(Op::kGetNumKeys))).i64();
}

std::vector<std::string> list(Client& c) {
  Reply r(c.call(req(Op::kListKeys)));
  std::vector<std::string> keys(static_cast<size_t>(r.i64()));
  for (auto& k : keys) k = r.bytes();
  std::sort(keys.begin(), keys.end());
  return keys;
}

// An agent store as a worker finds it: the agents' keys, the keyspace named.
void agent_store(KeyValueState& state) {
  state.set("/ddprun/job/r0/joined", "1");
  state.set("/ddprun/job/r0/complete", "1");
  state.set("/ddprun/job/r0/node/0", "h:1");
  state.set("/ddprun/job/closed_rounds", "0");
  state.set("/ddprun/worker_keyspace", "job/r0");
}

TEST_CASE("a worker's GETNUMKEYS counts its keyspace from its first request on",
          "[store_session][keyspace]") {
  KeyValueState state;
  agent_store(state);
  REQUIRE(state.num_keys() == 5);
  Client worker(state, Dialect::kModern);
  CHECK(num_keys(worker) == 0);  // not the agents' 5 keys
  worker.call(req(Op::kSet, {"/a"}, {"1"}));
  CHECK(num_keys(worker) == 1);
  worker.call(add_req("/b", 1));
  worker.call(req(Op::kSet, {"/c"}, {"1"}));
  CHECK(num_keys(worker) == 3);
  worker.call(req(Op::kGet, {"/ddprun/job/closed_rounds"}));  // an agent key read later changes nothing
  CHECK(num_keys(worker) == 3);
  CHECK(list(worker) == std::vector<std::string>{"/a", "/b", "/c"});

  Client lister(state, Dialect::kModern);  // LIST first binds just the same
  CHECK(list(lister) == std::vector<std::string>{"/a", "/b", "/c"});
  CHECK(num_keys(lister) == 3);
}

TEST_CASE("a session that asked for the count before the next keyspace keeps its own",
          "[store_session][keyspace]") {
  KeyValueState state;
  agent_store(state);
  Client early(state, Dialect::kLegacy);
  CHECK(num_keys(early) == 0);  // bound to job/r0
  state.set("/ddprun/worker_keyspace", "job/r1");
  Client late(state, Dialect::kModern);
  late.call(req(Op::kSet, {"/x"}, {"1"}));
  CHECK(num_keys(early) == 0);
  CHECK(num_keys(late) == 1);
  early.call(req(Op::kSet, {"/y"}, {"1"}));
  CHECK(num_keys(early) == 1);
  CHECK(list(late) == std::vector<std::string>{"/x"});
}

TEST_CASE("an agent's session counts and lists the whole store, before and after a worker key",
          "[store_session][keyspace]") {
  KeyValueState state;
  agent_store(state);
  Client agent(state, Dialect::kModern);
  agent.call(req(Op::kGet, {"/ddprun/worker_keyspace"}));  // agent keys first: the whole store
  CHECK(num_keys(agent) == 5);
  Client worker(state, Dialect::kModern);
  worker.call(req(Op::kSet, {"/w"}, {"1"}));
  CHECK(num_keys(agent) == 6);
  agent.call(req(Op::kSet, {"/mine"}, {"1"}));  // scoped into job/r0, as every worker key
  CHECK(num_keys(agent) == 7);
  CHECK(get_value(worker, "/mine") == "1");
  const auto keys = list(agent);
  CHECK(std::count(keys.begin(), keys.end(), "/ddprun/ws/job/r0//w") == 1);  // as stored
}

TEST_CASE("without a keyspace every session counts the whole store", "[store_session][keyspace]") {
  KeyValueState state;
  Client a(state, Dialect::kModern), b(state, Dialect::kLegacy);
  CHECK(num_keys(a) == 0);
  b.call(req(Op::kSet, {"/ddprun/x"}, {"1"}));
  a.call(req(Op::kSet, {"/k"}, {"1"}));
  CHECK(num_keys(a) == 2);
  CHECK(num_keys(b) == 2);
  // A keyspace named later does not change the view of a session bound before it.
  state.set("/ddprun/worker_keyspace", "r0");
  CHECK(num_keys(a) == 3);
}

}  // namespace
}  // namespace ddprun::rdzv
