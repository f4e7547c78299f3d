// EtcdClient (rendezvous/etcd/etcd_client.h) against one real etcd 3.4 member (etcd_process.h): etcd's v2
// keys API as the client speaks it — set, get, create, compare-and-swap, TTLs and refresh, directories,
// delete and compare-and-delete, watches (plain and recursive, a change or nullopt at the timeout), every
// byte of a key and value round-tripping — and one keep-alive connection carrying every request.
// Members that fail and servers that are not etcd: etcd_client_failover_itest.cc; TLS:
// etcd_client_tls_itest.cc.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "catch_compat.h"
#include "etcd_client_fixture.h"
#include "etcd_process.h"
#include "eventually.h"
#include "rendezvous/etcd/etcd_client.h"

namespace ddprun::rdzv::etcd {
namespace {

using namespace client_fixture;
using testing::EtcdProcess;

TEST_CASE("etcd: set, get and create", "[etcd]") {
  Client client(options_for({shared_etcd().endpoint()}));
  const Response set = client.write("/t/set/a", "one");
  CHECK(set.action == "set");
  CHECK(set.node.key == "/t/set/a");
  CHECK(set.node.value == "one");
  CHECK(set.node.modified_index > 0);
  CHECK(set.etcd_index == set.node.modified_index);
  CHECK(client.current_endpoint() == shared_etcd().endpoint().to_string());

  const Response got = client.get("t/set/a");  // a leading '/' added
  CHECK(got.action == "get");
  CHECK(got.node.value == "one");
  CHECK(got.etcd_index >= set.etcd_index);

  const Response replaced = client.write("/t/set/a", "two");
  REQUIRE(replaced.prev_node.has_value());
  CHECK(replaced.prev_node->value == "one");

  WriteOptions create;
  create.prev_exist = false;
  try {
    client.write("/t/set/a", "three", create);
    FAIL("a create of an existing key succeeded");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kNodeExist);
    CHECK(e.index() >= replaced.etcd_index);
    CHECK_THAT(e.what(), Catch::Contains("/t/set/a") && Catch::Contains("Key already exists"));
  }
  const Response created = client.write("/t/set/b", "new", create);
  CHECK(created.action == "create");
  CHECK(client.get("/t/set/a").node.value == "two");
}

TEST_CASE("etcd: a missing key is error 100 naming the key", "[etcd]") {
  Client client(options_for({shared_etcd().endpoint()}));
  try {
    client.get("/t/missing/key");
    FAIL("a missing key was found");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kKeyNotFound);
    CHECK(e.index() > 0);
    CHECK_THAT(e.what(), Catch::Contains("/t/missing/key") && Catch::Contains("Key not found"));
  }
  WriteOptions update;
  update.prev_exist = true;
  try {
    client.write("/t/missing/other", "x", update);
    FAIL("an update of a missing key succeeded");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kKeyNotFound);
  }
}

TEST_CASE("etcd: compare-and-swap on the value and on the index", "[etcd]") {
  Client client(options_for({shared_etcd().endpoint()}));
  const Response first = client.write("/t/cas/k", "v1");

  WriteOptions by_value;
  by_value.prev_value = "v1";
  const Response swapped = client.write("/t/cas/k", "v2", by_value);
  CHECK(swapped.action == "compareAndSwap");
  CHECK(swapped.node.value == "v2");
  try {
    client.write("/t/cas/k", "v3", by_value);  // the value is v2 now
    FAIL("a compare-and-swap on a stale value succeeded");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kTestFailed);
    CHECK_THAT(e.what(), Catch::Contains("Compare failed"));
  }

  WriteOptions by_index;
  by_index.prev_index = first.node.modified_index;  // stale
  try {
    client.write("/t/cas/k", "v3", by_index);
    FAIL("a compare-and-swap on a stale index succeeded");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kTestFailed);
  }
  by_index.prev_index = swapped.node.modified_index;
  CHECK(client.write("/t/cas/k", "v3", by_index).node.value == "v3");
  CHECK(client.get("/t/cas/k").node.value == "v3");
}

TEST_CASE("etcd: a TTL is reported, refreshed, and the key expires", "[etcd]") {
  Client client(options_for({shared_etcd().endpoint()}));
  WriteOptions ttl;
  ttl.ttl = 100;
  const Response kept = client.write("/t/ttl/kept", "v", ttl);
  REQUIRE(kept.node.ttl.has_value());
  CHECK(*kept.node.ttl > 90);
  WriteOptions refresh;
  refresh.ttl = 500;
  refresh.refresh = true;
  const Response refreshed = client.write("/t/ttl/kept", "", refresh);
  REQUIRE(refreshed.node.ttl.has_value());
  CHECK(*refreshed.node.ttl > 400);
  CHECK(refreshed.node.value == "v");  // a refresh keeps the value

  ttl.ttl = 1;
  const Response short_lived = client.write("/t/ttl/gone", "v", ttl);
  const auto expired = client.watch("/t/ttl/gone", short_lived.node.modified_index + 1, false, 10s);
  REQUIRE(expired.has_value());
  CHECK(expired->action == "expire");
  CHECK(expired->node.key == "/t/ttl/gone");
  REQUIRE(expired->prev_node.has_value());
  CHECK(expired->prev_node->value == "v");
  try {
    client.get("/t/ttl/gone");
    FAIL("an expired key was found");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kKeyNotFound);
  }
}

TEST_CASE("etcd: directories list their children, recursively on demand", "[etcd]") {
  Client client(options_for({shared_etcd().endpoint()}));
  WriteOptions dir;
  dir.dir = true;
  const Response made = client.write("/t/dir/d", "", dir);
  CHECK(made.node.dir);
  client.write("/t/dir/d/a", "1");
  client.write("/t/dir/d/sub/b", "2");

  const Response listing = client.get("/t/dir/d");
  CHECK(listing.node.dir);
  REQUIRE(listing.node.nodes.size() == 2);
  const Node* sub = nullptr;
  for (const auto& child : listing.node.nodes) {
    if (child.key == "/t/dir/d/a") CHECK(child.value == "1");
    if (child.key == "/t/dir/d/sub") sub = &child;
  }
  REQUIRE(sub != nullptr);
  CHECK(sub->dir);
  CHECK(sub->nodes.empty());  // not recursive

  GetOptions recursive;
  recursive.recursive = true;
  recursive.quorum = true;
  const Response tree = client.get("/t/dir/d", recursive);
  bool found = false;
  for (const auto& child : tree.node.nodes) {
    if (child.key != "/t/dir/d/sub") continue;
    REQUIRE(child.nodes.size() == 1);
    CHECK(child.nodes[0].key == "/t/dir/d/sub/b");
    CHECK(child.nodes[0].value == "2");
    found = true;
  }
  CHECK(found);

  DeleteOptions remove_dir;
  remove_dir.dir = true;
  try {
    client.remove("/t/dir/d", remove_dir);
    FAIL("a directory with children was removed without recursive");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kDirNotEmpty);
  }
  remove_dir.recursive = true;
  CHECK(client.remove("/t/dir/d", remove_dir).action == "delete");
  CHECK_THROWS_AS(client.get("/t/dir/d/a"), EtcdKeyError);
}

TEST_CASE("etcd: delete and compare-and-delete", "[etcd]") {
  Client client(options_for({shared_etcd().endpoint()}));
  client.write("/t/del/plain", "p");
  const Response removed = client.remove("/t/del/plain");
  CHECK(removed.action == "delete");
  REQUIRE(removed.prev_node.has_value());
  CHECK(removed.prev_node->value == "p");

  const Response written = client.write("/t/del/cad", "mine");
  DeleteOptions wrong;
  wrong.prev_value = "theirs";
  try {
    client.remove("/t/del/cad", wrong);
    FAIL("a compare-and-delete on the wrong value succeeded");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kTestFailed);
  }
  DeleteOptions stale;
  stale.prev_index = written.node.modified_index + 1000;
  CHECK_THROWS_AS(client.remove("/t/del/cad", stale), EtcdKeyError);
  DeleteOptions right;
  right.prev_value = "mine";
  CHECK(client.remove("/t/del/cad", right).action == "compareAndDelete");
  try {
    client.remove("/t/del/cad");
    FAIL("a deleted key was deleted again");
  } catch (const EtcdKeyError& e) {
    CHECK(e.code() == kKeyNotFound);
  }
}

TEST_CASE("etcd: a watch returns the change, or nullopt at its timeout", "[etcd][watch]") {
  Client client(options_for({shared_etcd().endpoint()}));
  const Response start = client.write("/t/watch/k", "0");

  // A change made while the watch waits (or before: waitIndex finds it in the history either way).
  auto writer = std::async(std::launch::async, [&] {
    Client other(options_for({shared_etcd().endpoint()}));
    return other.write("/t/watch/k", "1");
  });
  const auto changed = client.watch("/t/watch/k", start.etcd_index + 1, false, 10s);
  const Response write = writer.get();
  REQUIRE(changed.has_value());
  CHECK(changed->action == "set");
  CHECK(changed->node.value == "1");
  CHECK(changed->node.modified_index == write.node.modified_index);

  // An older index: the first change at or after it, from etcd's history.
  const auto past = client.watch("/t/watch/k", start.node.modified_index, false, 10s);
  REQUIRE(past.has_value());
  CHECK(past->node.value == "0");

  // Nothing changes: nullopt at the timeout, not much later.
  const auto before = Clock::now();
  const auto nothing = client.watch("/t/watch/k", write.etcd_index + 1, false, 300ms);
  CHECK_FALSE(nothing.has_value());
  CHECK(since(before) >= 300ms);
  CHECK(since(before) < 2s);
  // The client goes on after a watch it abandoned.
  CHECK(client.get("/t/watch/k").node.value == "1");
}

TEST_CASE("etcd: a recursive watch sees changes below the directory", "[etcd][watch]") {
  Client client(options_for({shared_etcd().endpoint()}));
  const Response start = client.write("/t/rwatch/other", "x");
  Client other(options_for({shared_etcd().endpoint()}));
  other.write("/t/rwatch/d/deep/key", "v");
  CHECK_FALSE(client.watch("/t/rwatch/d", start.etcd_index + 1, false, 200ms).has_value());
  const auto deep = client.watch("/t/rwatch/d", start.etcd_index + 1, true, 10s);
  REQUIRE(deep.has_value());
  CHECK(deep->node.key == "/t/rwatch/d/deep/key");
  CHECK(deep->node.value == "v");
}

TEST_CASE("etcd: bytes in values and keys round-trip", "[etcd]") {
  Client client(options_for({shared_etcd().endpoint()}));
  // Every byte 1..127 (etcd's JSON carries valid UTF-8 only: bytes >= 0x80 go as UTF-8 text), and some UTF-8.
  std::string value;
  for (int c = 1; c < 128; ++c) value += static_cast<char>(c);
  value += std::string("\0 after NUL", 11) + " \xc3\xa9t\xc3\xa9 \xe2\x82\xac";
  const std::string key = "/t/bytes/a b&c=d?e#f%g+h;i\xc3\xa9/~x.y-z_";
  client.write(key, value);
  const Response got = client.get(key);
  CHECK(got.node.key == key);
  CHECK(got.node.value == value);
  CHECK(client.get("/t/bytes").node.nodes.size() == 1);
  WriteOptions cas;
  cas.prev_value = value;  // a form field with every byte, compared by etcd
  CHECK(client.write(key, "plain", cas).action == "compareAndSwap");
}

// TCP connections to `port` on 127.0.0.1 (/proc/self/net/tcp): this process's established ones (by socket
// inode; etcd's connections to itself are not), and every one in time-wait (06: one per connection that the
// client side closed).
std::pair<int, int> connections_to(uint16_t port) {
  std::set<std::string> own;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) own.insert(target.substr(8, target.size() - 9));
  }
  std::ifstream table("/proc/self/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  int established = 0, time_wait = 0;
  char remote[16];
  std::snprintf(remote, sizeof remote, "0100007F:%04X", port);
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, rem, state, queues, timer, retransmits, uid, timeout, inode;
    fields >> slot >> local >> rem >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    if (rem != remote) continue;
    if (state == "01" && own.count(inode) != 0) ++established;
    if (state == "06") ++time_wait;
  }
  return {established, time_wait};
}

TEST_CASE("etcd: one keep-alive connection carries every request", "[etcd]") {
  EtcdProcess etcd;
  const uint16_t port = etcd.endpoint().port;
  const int time_wait = connections_to(port).second;
  {
    Client client(options_for({etcd.endpoint()}));
    for (int i = 0; i < 20; ++i) {
      client.write("/t/keepalive/k", std::to_string(i));
      CHECK(client.get("/t/keepalive/k").node.value == std::to_string(i));
    }
    CHECK(connections_to(port) == std::pair{1, time_wait});
  }
  // The destructor closed it: at once, no connection of this process is left; the closed one reaches
  // time-wait when etcd has closed its side too (the kernel keeps it in FIN_WAIT2 until then, briefly).
  CHECK(connections_to(port).first == 0);
  std::pair<int, int> last;
  auto in_time_wait = [&] { return (last = connections_to(port)) == std::pair{0, time_wait + 1}; };
  const bool closed = testing::eventually(in_time_wait, 5s);
  INFO("established, time-wait: " << last.first << ", " << last.second << " (before: " << time_wait << ")");
  CHECK(closed);
}

TEST_CASE("etcd: no endpoints is an invalid argument", "[etcd]") {
  CHECK_THROWS_AS(Client(ClientOptions{}), std::invalid_argument);
}

}  // namespace
}  // namespace ddprun::rdzv::etcd
