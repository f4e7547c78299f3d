// Tests of the store's data model: TCPStore value semantics, waiters, watches and byte accounting.
#include "rendezvous/store/key_value_state.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "catch_compat.h"

namespace ddprun::rdzv {
namespace {

std::optional<std::string> value_of(const KeyValueState& s, const std::string& key) {
  const std::string* v = s.get(key);
  return v ? std::optional<std::string>(*v) : std::nullopt;
}

// A returned buffer's bytes (nullopt: no value).
std::optional<std::string> text(const SharedValue& v) {
  return v ? std::optional<std::string>(*v) : std::nullopt;
}

TEST_CASE("set, get, check, remove, num_keys", "[key_value_state]") {
  KeyValueState s;
  CHECK(s.get("a") == nullptr);
  CHECK(s.num_keys() == 0);
  s.set("a", "1");
  s.set("b", "");
  CHECK(value_of(s, "a") == "1");
  CHECK(value_of(s, "b") == "");
  CHECK(s.num_keys() == 2);
  s.set("a", "2");
  CHECK(value_of(s, "a") == "2");
  CHECK(s.num_keys() == 2);

  CHECK(s.check({"a", "b"}));
  CHECK(s.check({}));
  CHECK_FALSE(s.check({"a", "c"}));

  CHECK(s.remove("a"));
  CHECK_FALSE(s.remove("a"));
  CHECK(s.get("a") == nullptr);
  CHECK(s.num_keys() == 1);
  CHECK_FALSE(s.check({"a"}));

  std::vector<std::string> keys = s.list_keys();
  CHECK(keys == std::vector<std::string>{"b"});
}

TEST_CASE("connection-bound keys go with the owner that last set them", "[key_value_state]") {
  CHECK(KeyValueState::connection_bound("/ddprun/job/live/h1:42"));
  CHECK_FALSE(KeyValueState::connection_bound("/ddprun/job/r0/closed"));
  CHECK_FALSE(KeyValueState::connection_bound("/live/x"));  // a worker's key: never bound
  KeyValueState s;
  s.set("/ddprun/job/live/a", "1");
  s.bind_to_owner("/ddprun/job/live/a", 1);
  s.set("/ddprun/job/live/b", "1");
  s.bind_to_owner("/ddprun/job/live/b", 2);
  s.release_owner(1);
  CHECK(s.get("/ddprun/job/live/a") == nullptr);
  CHECK(s.get("/ddprun/job/live/b") != nullptr);
  // Set again by a new owner (the agent reconnected) before the old connection's end is seen: it stays.
  s.bind_to_owner("/ddprun/job/live/b", 3);
  s.release_owner(2);
  CHECK(s.get("/ddprun/job/live/b") != nullptr);
  s.release_owner(3);
  CHECK(s.num_keys() == 0);
}

TEST_CASE("the release hook is told only the keys a closed connection removed", "[key_value_state]") {
  KeyValueState s;
  std::vector<std::string> released;
  s.set_release_hook([&](const std::string& key) { released.push_back(key); });
  s.set("/ddprun/job/live/a", "1");
  s.bind_to_owner("/ddprun/job/live/a", 1);
  s.set("/ddprun/job/live/b", "1");
  s.bind_to_owner("/ddprun/job/live/b", 1);
  CHECK(s.remove("/ddprun/job/live/b"));  // another client deleted it while its owner was connected
  s.release_owner(1);
  CHECK(released == std::vector<std::string>{"/ddprun/job/live/a"});  // not b: it was gone already
  released.clear();
  s.release_owner(1);  // nothing left to release
  s.release_owner(7);  // an owner that never owned anything
  CHECK(released.empty());
}

TEST_CASE("compare_set follows TCPStore", "[key_value_state]") {
  KeyValueState s;
  SECTION("missing key, empty expected: stores desired and returns it") {
    CHECK(text(s.compare_set("k", "", "d")) == "d");
    CHECK(value_of(s, "k") == "d");
  }
  SECTION("missing key, non-empty expected: returns expected, stores nothing") {
    CHECK(text(s.compare_set("k", "e", "d")) == "e");
    CHECK(s.get("k") == nullptr);
    CHECK(s.num_keys() == 0);
  }
  SECTION("present and equal: replaces") {
    s.set("k", "e");
    CHECK(text(s.compare_set("k", "e", "d")) == "d");
    CHECK(value_of(s, "k") == "d");
  }
  SECTION("present and different: returns the current value unchanged") {
    s.set("k", "c");
    CHECK(text(s.compare_set("k", "e", "d")) == "c");
    CHECK(value_of(s, "k") == "c");
  }
  SECTION("present with an empty value, empty expected: replaces") {
    s.set("k", "");
    CHECK(text(s.compare_set("k", "", "d")) == "d");
    CHECK(value_of(s, "k") == "d");
  }
}

TEST_CASE("add stores ASCII decimal", "[key_value_state]") {
  KeyValueState s;
  CHECK(s.add("n", 5) == 5);  // missing counts as 0
  CHECK(value_of(s, "n") == "5");
  CHECK(s.add("n", -7) == -2);
  CHECK(value_of(s, "n") == "-2");
  CHECK(s.add("n", 0) == -2);  // add(k, 0) reads
  CHECK(value_of(s, "n") == "-2");
  CHECK(s.add("zero", 0) == 0);
  CHECK(value_of(s, "zero") == "0");

  s.set("t", "41");  // a value set as text is an integer too
  CHECK(s.add("t", 1) == 42);
  s.set("plus", "+3");
  CHECK(s.add("plus", 1) == 4);
}

TEST_CASE("add on a non-integer or overflowing value changes nothing", "[key_value_state]") {
  KeyValueState s;
  const std::string bad =
      GENERATE(as<std::string>{}, "abc", "", "1x", " 1", "1 ", "0x10", "1.5", "--1", "99999999999999999999");
  INFO("value '" << bad << "'");
  s.set("k", bad);
  int events = 0;
  s.watch("k", [&](WatchEvent, const std::string&, const SharedValue&, const SharedValue&) { ++events; });
  CHECK_FALSE(s.add("k", 1).has_value());
  CHECK_FALSE(s.add("k", 0).has_value());
  CHECK(value_of(s, "k") == bad);
  CHECK(events == 0);

  s.set("max", std::to_string(std::numeric_limits<int64_t>::max()));
  CHECK_FALSE(s.add("max", 1).has_value());
  CHECK(value_of(s, "max") == std::to_string(std::numeric_limits<int64_t>::max()));
  s.set("min", std::to_string(std::numeric_limits<int64_t>::min()));
  CHECK_FALSE(s.add("min", -1).has_value());
  CHECK(s.add("min", 0) == std::numeric_limits<int64_t>::min());
  CHECK(s.add("fresh", std::numeric_limits<int64_t>::min()) == std::numeric_limits<int64_t>::min());
}

TEST_CASE("append concatenates and creates missing keys", "[key_value_state]") {
  KeyValueState s;
  s.append("k", "ab");
  CHECK(value_of(s, "k") == "ab");
  s.append("k", std::string_view("\0c", 2));
  CHECK(value_of(s, "k") == std::string("ab\0c", 4));
  s.append("k", "");
  CHECK(value_of(s, "k") == std::string("ab\0c", 4));
  CHECK(s.num_keys() == 1);
}

TEST_CASE("queues are FIFO and separate from keys", "[key_value_state]") {
  KeyValueState s;
  CHECK(s.queue_len("q") == 0);
  CHECK(s.queue_pop("q") == nullptr);
  s.queue_push("q", "1");
  s.queue_push("q", "2");
  s.queue_push("q", "3");
  CHECK(s.queue_len("q") == 3);
  CHECK(s.num_keys() == 0);
  CHECK(s.get("q") == nullptr);
  CHECK(s.check({"q"}));  // a non-empty queue counts as present
  CHECK(text(s.queue_pop("q")) == "1");
  CHECK(text(s.queue_pop("q")) == "2");
  CHECK(s.queue_len("q") == 1);
  CHECK(text(s.queue_pop("q")) == "3");
  CHECK(s.queue_pop("q") == nullptr);
  CHECK(s.queue_len("q") == 0);
  CHECK_FALSE(s.check({"q"}));
}

TEST_CASE("wait returns nullopt when every key exists", "[key_value_state]") {
  KeyValueState s;
  s.set("a", "1");
  s.queue_push("q", "x");
  int fired = 0;
  CHECK_FALSE(s.wait({"a", "q"}, [&] { ++fired; }).has_value());
  CHECK_FALSE(s.wait({}, [&] { ++fired; }).has_value());
  CHECK(fired == 0);
  CHECK(s.pending_waits() == 0);
}

// Writes `key` with one of the mutating operations.
void write_with(KeyValueState& s, const std::string& how, const std::string& key) {
  if (how == "set") {
    s.set(key, "v");
  } else if (how == "add") {
    s.add(key, 1);
  } else if (how == "append") {
    s.append(key, "v");
  } else if (how == "compare_set") {
    s.compare_set(key, "", "v");
  } else if (how == "queue_push") {
    s.queue_push(key, "v");
  } else {
    FAIL("unknown writer " << how);
  }
}

TEST_CASE("a waiter fires exactly once after all its keys are written", "[key_value_state]") {
  const std::string how = GENERATE(as<std::string>{}, "set", "add", "append", "compare_set", "queue_push");
  INFO("last key written by " << how);
  KeyValueState s;
  s.set("present", "x");
  int fired = 0;
  auto id = s.wait({"a", "present", "b"}, [&] {
    ++fired;
    // Runs after the state is updated.
    CHECK((s.get("b") != nullptr || s.queue_len("b") > 0));
  });
  REQUIRE(id.has_value());
  CHECK(s.pending_waits() == 1);

  s.set("present", "y");  // not a key the waiter misses
  s.set("unrelated", "z");
  s.set("a", "1");
  CHECK(fired == 0);
  s.set("a", "2");  // writing the same key twice does not count twice
  CHECK(fired == 0);
  s.compare_set("b", "not-there", "v");  // a compare_set that stores nothing is not a write
  CHECK(fired == 0);
  CHECK(s.pending_waits() == 1);

  write_with(s, how, "b");
  CHECK(fired == 1);
  CHECK(s.pending_waits() == 0);
  CHECK_FALSE(s.cancel_wait(*id));

  write_with(s, how, "b");
  s.set("a", "3");
  CHECK(fired == 1);
}

TEST_CASE("a waiter counts writes, not presence", "[key_value_state]") {
  KeyValueState s;
  int fired = 0;
  REQUIRE(s.wait({"a", "b"}, [&] { ++fired; }).has_value());
  s.set("a", "1");
  CHECK(s.remove("a"));
  s.set("b", "1");
  CHECK(fired == 1);
}

TEST_CASE("cancel_wait", "[key_value_state]") {
  KeyValueState s;
  int fired = 0;
  auto id = s.wait({"k"}, [&] { ++fired; });
  REQUIRE(id.has_value());
  CHECK(s.cancel_wait(*id));
  CHECK_FALSE(s.cancel_wait(*id));
  CHECK(s.pending_waits() == 0);
  s.set("k", "v");
  CHECK(fired == 0);
  CHECK_FALSE(s.cancel_wait(12345));
}

TEST_CASE("cancelled waits leave nothing in the key index", "[key_value_state]") {
  KeyValueState s;
  int fired = 0;
  // A client waiting over and over on keys nobody writes, cancelling each time (or disconnecting).
  for (int i = 0; i < 1000; ++i) {
    auto id = s.wait({"never/" + std::to_string(i), "shared", "shared"}, [&] { ++fired; });
    REQUIRE(id.has_value());
    REQUIRE(s.cancel_wait(*id));
  }
  CHECK(s.pending_waits() == 0);
  CHECK(s.waited_keys() == 0);
  // Partly satisfied, then cancelled: the written key's entries are gone, the other key's are dropped.
  auto id = s.wait({"a", "b"}, [&] { ++fired; });
  REQUIRE(id.has_value());
  s.set("a", "1");
  CHECK(s.waited_keys() == 1);
  CHECK(s.cancel_wait(*id));
  CHECK(s.waited_keys() == 0);
  // Another waiter on the same key is untouched by a cancel.
  auto keep = s.wait({"c"}, [&] { ++fired; });
  auto drop = s.wait({"c"}, [&] { fired += 100; });
  REQUIRE(keep.has_value());
  REQUIRE(drop.has_value());
  CHECK(s.cancel_wait(*drop));
  CHECK(s.waited_keys() == 1);
  s.set("c", "1");
  CHECK(fired == 1);
  CHECK(s.waited_keys() == 0);
}

TEST_CASE("several waiters on one key all fire", "[key_value_state]") {
  KeyValueState s;
  std::vector<int> order;
  auto w1 = s.wait({"k"}, [&] { order.push_back(1); });
  auto w2 = s.wait({"k", "other"}, [&] { order.push_back(2); });
  auto w3 = s.wait({"k"}, [&] { order.push_back(3); });
  auto w4 = s.wait({"k"}, [&] { order.push_back(4); });
  REQUIRE((w1 && w2 && w3 && w4));
  CHECK(s.cancel_wait(*w3));
  s.set("k", "v");
  std::sort(order.begin(), order.end());
  CHECK(order == std::vector<int>{1, 4});
  CHECK(s.pending_waits() == 1);  // w2 still misses "other"
  s.set("other", "v");
  CHECK(order.size() == 3);
  CHECK(order.back() == 2);
  CHECK(s.pending_waits() == 0);
}

TEST_CASE("a queue push wakes one waiter of the queue's key", "[key_value_state]") {
  KeyValueState s;
  int first = 0, second = 0;
  REQUIRE(s.wait({"q"}, [&] { ++first; }).has_value());
  REQUIRE(s.wait({"q"}, [&] { ++second; }).has_value());
  s.queue_push("q", "1");
  CHECK(first + second == 1);
  CHECK(s.pending_waits() == 1);
  s.queue_push("q", "2");
  CHECK(first == 1);
  CHECK(second == 1);
  CHECK(s.pending_waits() == 0);
}

TEST_CASE("a waiter may cancel itself from its own callback", "[key_value_state]") {
  KeyValueState s;
  std::optional<KeyValueState::HandleId> id;
  std::optional<bool> cancel_result;
  int other = 0;
  id = s.wait({"k"}, [&] { cancel_result = s.cancel_wait(*id); });
  REQUIRE(id.has_value());
  REQUIRE(s.wait({"k"}, [&] { ++other; }).has_value());
  s.set("k", "v");
  REQUIRE(cancel_result.has_value());
  CHECK_FALSE(*cancel_result);
  CHECK(other == 1);
  CHECK(s.pending_waits() == 0);
  s.set("k", "w");
  CHECK(other == 1);
}

struct Event {
  WatchEvent event;
  std::string key;
  std::optional<std::string> old_value, new_value;
  bool operator==(const Event&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Event& e) {
  return os << "{" << int(e.event) << " " << e.key << " " << e.old_value.value_or("<null>") << " "
            << e.new_value.value_or("<null>") << "}";
}

TEST_CASE("watches report created, updated and deleted with old and new values", "[key_value_state]") {
  KeyValueState s;
  std::vector<Event> events;
  auto id =
      s.watch("k", [&](WatchEvent ev, const std::string& key, const SharedValue& o, const SharedValue& n) {
        events.push_back({ev, key, text(o), text(n)});
      });
  CHECK(s.watches() == 1);
  s.set("other", "x");
  s.set("k", "1");
  s.add("k", 2);
  s.append("k", "0");
  s.compare_set("k", "30", "c");
  s.compare_set("k", "nope", "d");  // no change, no event
  CHECK(s.remove("k"));
  CHECK_FALSE(s.remove("k"));
  s.compare_set("k", "", "new");
  s.append("k", "!");
  s.remove("k");
  s.append("k", "a");

  using E = WatchEvent;
  const std::vector<Event> expected = {
      {E::kKeyCreated, "k", std::nullopt, "1"}, {E::kKeyUpdated, "k", "1", "3"},
      {E::kKeyUpdated, "k", "3", "30"},         {E::kKeyUpdated, "k", "30", "c"},
      {E::kKeyDeleted, "k", "c", std::nullopt}, {E::kKeyCreated, "k", std::nullopt, "new"},
      {E::kKeyUpdated, "k", "new", "new!"},     {E::kKeyDeleted, "k", "new!", std::nullopt},
      {E::kKeyCreated, "k", std::nullopt, "a"},
  };
  CHECK(events == expected);

  s.unwatch(id);
  CHECK(s.watches() == 0);
  s.set("k", "after");
  s.remove("k");
  CHECK(events.size() == expected.size());
  s.unwatch(id);  // twice is harmless
}

TEST_CASE("several watches on a key, one removing itself", "[key_value_state]") {
  KeyValueState s;
  int a = 0, b = 0;
  KeyValueState::HandleId ida = 0;
  ida = s.watch("k", [&](WatchEvent, const std::string&, const SharedValue&, const SharedValue&) {
    ++a;
    s.unwatch(ida);
  });
  s.watch("k", [&](WatchEvent, const std::string&, const SharedValue&, const SharedValue&) { ++b; });
  s.set("k", "1");
  s.set("k", "2");
  CHECK(a == 1);
  CHECK(b == 2);
  CHECK(s.watches() == 1);
}

TEST_CASE("stored_bytes counts keys and values and returns to 0", "[key_value_state]") {
  KeyValueState s;
  CHECK(s.stored_bytes() == 0);
  s.set("abc", "12345");
  CHECK(s.stored_bytes() == 8);
  s.set("abc", "1");
  CHECK(s.stored_bytes() == 4);
  s.append("abc", "xy");
  CHECK(s.stored_bytes() == 6);
  s.append("new", "q");
  CHECK(s.stored_bytes() == 10);
  CHECK(s.add("n", 10) == 10);  // "n" + "10"
  CHECK(s.stored_bytes() == 13);
  CHECK(s.add("n", 90) == 100);
  CHECK(s.stored_bytes() == 14);
  CHECK(text(s.compare_set("c", "", "vv")) == "vv");
  CHECK(s.stored_bytes() == 17);
  CHECK(text(s.compare_set("c", "vv", "v")) == "v");
  CHECK(s.stored_bytes() == 16);
  s.queue_push("qq", "aaa");
  s.queue_push("qq", "b");
  CHECK(s.stored_bytes() == 22);

  CHECK(text(s.queue_pop("qq")) == "aaa");
  CHECK(text(s.queue_pop("qq")) == "b");
  for (const auto& k : s.list_keys()) CHECK(s.remove(k));
  CHECK(s.num_keys() == 0);
  CHECK(s.stored_bytes() == 0);
}

}  // namespace
}  // namespace ddprun::rdzv
