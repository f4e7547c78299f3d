// Unit tests of the round-stop codec (encode_round_stop / decode_round_stop) and of RoundKeys, the store
// steps both rendezvous backends share, on an in-memory Store: no sockets, no threads.
#include "rendezvous/round_keys.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/key_value_state.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;

// Store semantics on a map, single-threaded: a wait (or get) on a missing key times out at once. Keys are
// stored as the caller names them (no client prefix). `fail` makes every operation a lost connection.
class MemoryStore final : public Store {
 public:
  MemoryStore() : Store(1s) {}

  std::map<std::string, std::string, std::less<>> data;
  bool fail = false;
  int requests = 0;

  void set(std::string_view key, std::string_view value) override {
    touch();
    data[std::string(key)] = value;
  }
  std::string get(std::string_view key) override {
    touch();
    auto it = data.find(key);
    if (it == data.end()) throw TimeoutError("GET '" + std::string(key) + "': timed out");
    return it->second;
  }
  int64_t add(std::string_view key, int64_t delta) override {
    touch();
    auto& v = data[std::string(key)];
    int64_t n = (v.empty() ? 0 : std::stoll(v)) + delta;
    v = std::to_string(n);
    return n;
  }
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override {
    touch();
    auto it = data.find(key);
    if (it == data.end()) {
      if (!expected.empty()) return std::string(expected);
      data[std::string(key)] = desired;
      return std::string(desired);
    }
    if (it->second == expected) it->second = desired;
    return it->second;
  }
  bool check(const std::vector<std::string>& keys) override {
    touch();
    for (const auto& k : keys) {
      if (!data.count(k)) return false;
    }
    return true;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds) override {
    if (!check(keys)) throw WaitTimeoutError("WAIT: timed out");  // as StoreClient: keys absent in time
  }
  bool delete_key(std::string_view key) override {
    touch();
    auto it = data.find(key);
    if (it == data.end()) return false;
    data.erase(it);
    return true;
  }
  int64_t num_keys() override {
    touch();
    return static_cast<int64_t>(data.size());
  }
  void append(std::string_view key, std::string_view value) override {
    touch();
    data[std::string(key)] += value;
  }
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(get(k));
    return out;
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override {
    for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
  }

 private:
  void touch() {
    ++requests;
    if (fail) throw ConnectionLostError("lost the connection to the store at 127.0.0.1:1: End of file");
  }
};

RoundStop make_stop(RoundStop::Kind kind, int node, std::string detail, int code) {
  RoundStop s;
  s.kind = kind;
  s.node_rank = node;
  s.detail = std::move(detail);
  s.exit_code = code;
  return s;
}

}  // namespace

TEST_CASE("round stops encode as kind|node|exit code|detail and decode back", "[round_stop]") {
  using K = RoundStop::Kind;
  CHECK(encode_round_stop(make_stop(K::kDone, 2, "all nodes succeeded", 0)) ==
        "done|2|0|all nodes succeeded");
  CHECK(encode_round_stop(make_stop(K::kFailed, 0, "rank 3 on h: exit 7", 7)) ==
        "failed|0|7|rank 3 on h: exit 7");
  CHECK(encode_round_stop(make_stop(K::kShutdown, 1, "SIGTERM", 143)) == "shutdown|1|143|SIGTERM");
  CHECK(encode_round_stop(make_stop(K::kMembership, -1, "closer vanished", 0)) ==
        "membership|-1|0|closer vanished");

  auto kind = GENERATE(K::kDone, K::kFailed, K::kShutdown, K::kMembership);
  // The detail is free text: bars, an empty one, bytes of any kind survive.
  auto detail =
      GENERATE(std::string(), std::string("a|b|c"), std::string("line\nnext"), std::string("x\0y", 3));
  auto s = make_stop(kind, 5, detail, -9);
  auto back = decode_round_stop(encode_round_stop(s));
  REQUIRE(back);
  CHECK(back->kind == kind);
  CHECK(back->node_rank == 5);
  CHECK(back->exit_code == -9);
  CHECK(back->detail == detail);
}

TEST_CASE("decode_round_stop refuses what encode_round_stop cannot produce", "[round_stop]") {
  auto text = GENERATE(as<std::string>{}, "", "done", "done|1", "done|1|0", "finished|1|0|x", "DONE|1|0|x",
                       "done|x|0|d", "done|1|y|d", "done||0|d", "done|1||d",
                       // numbers with trailing junk, or beyond int, or not as encode writes them
                       "done|1x|0|d", "done|1|0x|d", "done|1 |0|d", "done|99999999999|0|d", "done|+1|0|d",
                       "done|01|0|d", "done|1|-0|d", "done| 1|0|d");
  INFO("'" << text << "'");
  CHECK_FALSE(decode_round_stop(text));
}

TEST_CASE("RoundKeys: key names under ddprun/<run_id>/", "[round_keys]") {
  RoundKeys keys("job-7");
  CHECK(keys.key("closed") == "ddprun/job-7/closed");
  CHECK(keys.round_key(0, "stop") == "ddprun/job-7/r0/stop");
  CHECK(keys.round_key(12, "node/3") == "ddprun/job-7/r12/node/3");
}

TEST_CASE("RoundKeys: the first stop of a round wins and wait_stopped reports it", "[round_keys]") {
  MemoryStore store;
  RoundKeys keys("job");
  CHECK_FALSE(keys.wait_stopped(store, 0, 10ms));  // nothing yet: a timeout, not an error

  auto first = make_stop(RoundStop::Kind::kFailed, 1, "rank 2 exited with 3", 3);
  RoundStop won = keys.stop(store, 0, first);
  CHECK(won.kind == RoundStop::Kind::kFailed);
  CHECK(store.data.at("ddprun/job/r0/stop") == "failed|1|3|rank 2 exited with 3");

  RoundStop second = keys.stop(store, 0, make_stop(RoundStop::Kind::kShutdown, 0, "SIGTERM", 143));
  CHECK(second.kind == RoundStop::Kind::kFailed);  // the earlier stop stays
  CHECK(second.node_rank == 1);
  CHECK(second.detail == "rank 2 exited with 3");

  auto seen = keys.wait_stopped(store, 0, 10ms);
  REQUIRE(seen);
  CHECK(seen->exit_code == 3);
  CHECK_FALSE(keys.wait_stopped(store, 1, 10ms));  // rounds are separate

  store.data["ddprun/job/r2/stop"] = "garbage";
  REQUIRE_THROWS_AS(keys.stop(store, 2, first), BadReplyError);
}

TEST_CASE("RoundKeys: the last node done stops the round as done", "[round_keys]") {
  MemoryStore store;
  RoundKeys keys("job");
  keys.done(store, 3, 3, 0);
  keys.done(store, 3, 3, 2);
  CHECK_FALSE(store.data.count("ddprun/job/r3/stop"));
  keys.done(store, 3, 3, 1);
  auto stop = keys.wait_stopped(store, 3, 10ms);
  REQUIRE(stop);
  CHECK(stop->kind == RoundStop::Kind::kDone);
  CHECK(stop->node_rank == 1);

  SECTION("a failure published first is not overwritten by the nodes that succeeded") {
    keys.stop(store, 4, make_stop(RoundStop::Kind::kFailed, 0, "rank 0 exited with 1", 1));
    keys.done(store, 4, 1, 0);
    CHECK(keys.wait_stopped(store, 4, 10ms)->kind == RoundStop::Kind::kFailed);
  }
}

TEST_CASE("RoundKeys: set_closed and is_closed", "[round_keys]") {
  MemoryStore store;
  RoundKeys a("job"), other("other-job");
  CHECK_FALSE(a.is_closed(store));
  a.set_closed(store);
  CHECK(a.is_closed(store));
  CHECK(store.data.count("ddprun/job/closed"));
  CHECK_FALSE(other.is_closed(store));  // one job's end does not close another's
}

TEST_CASE("RoundKeys: open_worker_keyspace names <run_id>/r<round> at the store's keyspace key",
          "[round_keys]") {
  MemoryStore store;
  RoundKeys keys("job");
  keys.open_worker_keyspace(store, 0);
  // A StoreClient adds the leading "/": the wire key is the one the store's KeyValueState watches.
  CHECK("/" + store.data.begin()->first == KeyValueState::kWorkerKeyspaceKey);
  CHECK(store.data.at("ddprun/worker_keyspace") == "job/r0");
  keys.open_worker_keyspace(store, 17);
  CHECK(store.data.at("ddprun/worker_keyspace") == "job/r17");
  RoundKeys("other").open_worker_keyspace(store, 1);
  CHECK(store.data.at("ddprun/worker_keyspace") == "other/r1");  // one current keyspace per store
  CHECK(store.data.size() == 1);
}

TEST_CASE("RoundKeys: leave counts the nodes out, the last one sets left_all, it never throws",
          "[round_keys]") {
  MemoryStore store;
  RoundKeys keys("job");
  keys.leave(store, 0, 2, false);
  CHECK(store.data.at("ddprun/job/r0/left") == "1");
  CHECK_FALSE(store.data.count("ddprun/job/r0/left_all"));
  keys.leave(store, 0, 2, true);  // the store host: left_all is there, so its wait returns at once
  CHECK(store.data.at("ddprun/job/r0/left_all") == "1");

  SECTION("the store host gives up waiting for nodes that never leave") {
    keys.leave(store, 1, 3, true);  // the in-memory wait times out at once; no exception
    CHECK(store.data.at("ddprun/job/r1/left") == "1");
  }
  SECTION("before any round, nothing is written") {
    int before = store.requests;
    keys.leave(store, -1, 0, true);
    keys.leave(store, 0, 0, true);
    CHECK(store.requests == before);
  }
  SECTION("a lost store is not an error when leaving") {
    store.fail = true;
    CHECK_NOTHROW(keys.leave(store, 0, 2, true));
    CHECK_THROWS_AS(keys.done(store, 0, 2, 0), ConnectionLostError);  // other steps report it
  }
}

}  // namespace ddprun::rdzv
