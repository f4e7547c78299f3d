// Integration tests of EtcdStore on a real etcd member (EtcdProcess): the Store contract on etcd, the key and
// value layout of torch's EtcdStore checked on the raw etcd nodes, and torch's own EtcdStore (python-etcd,
// /usr/bin/python3) reading what ddprun wrote and the other way round.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.h"
#include "etcd_process.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::rdzv::etcd {
namespace {

using namespace std::chrono_literals;
using testing::EtcdProcess;

std::shared_ptr<Client> client_of(const EtcdProcess& etcd) {
  return std::make_shared<Client>(ClientOptions{.endpoints = {etcd.endpoint()}, .request_timeout = 5s});
}

// Runs python3 (Debian's, with torch and python-etcd) on `script`; returns what it printed. Fails the test
// when it exits non-zero.
std::string python(const std::string& script) {
  const std::string cmd = "/usr/bin/python3 -c '" + script + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  INFO(out);
  REQUIRE(status == 0);
  return out;
}

TEST_CASE("EtcdStore keeps keys and values as torch's EtcdStore does", "[etcd][store]") {
  EtcdProcess etcd;
  auto client = client_of(etcd);
  EtcdStore store(client, "/t/kv", 2s);
  const std::string binary("a\0b\xff", 4);
  store.set("MASTER_ADDR", binary);
  CHECK(store.get("MASTER_ADDR") == binary);
  // The raw node: "<prefix>/<base64 key>" holding base64(value).
  Node raw = client->get("/t/kv/" + base64_encode("MASTER_ADDR")).node;
  CHECK(raw.value == base64_encode(binary));
  CHECK(base64_encode("MASTER_ADDR") == "TUFTVEVSX0FERFI=");
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -2) == 3);
  CHECK(client->get("/t/kv/" + base64_encode("n")).node.value == base64_encode("3"));
  CHECK(store.check({"n", "MASTER_ADDR"}));
  CHECK_FALSE(store.check({"n", "missing"}));
  CHECK(store.num_keys() == 2);
  CHECK(store.delete_key("n"));
  CHECK_FALSE(store.delete_key("n"));
  store.append("log", "ab");
  store.append("log", "cd");
  CHECK(store.get("log") == "abcd");
  store.multi_set({"x", "y"}, {"1", "2"});
  CHECK(store.multi_get({"y", "x"}) == std::vector<std::string>{"2", "1"});
}

TEST_CASE("EtcdStore compare_set follows the Store contract", "[etcd][store]") {
  EtcdProcess etcd;
  EtcdStore store(client_of(etcd), "/t/cas", 2s);
  CHECK(store.compare_set("k", "old", "new") == "old");  // missing, expected given: nothing stored
  CHECK_FALSE(store.check({"k"}));
  CHECK(store.compare_set("k", "", "first") == "first");   // missing, expected empty: stored
  CHECK(store.compare_set("k", "", "second") == "first");  // exists: the value now stored
  CHECK(store.compare_set("k", "wrong", "third") == "first");
  CHECK(store.compare_set("k", "first", "fourth") == "fourth");
  CHECK(store.get("k") == "fourth");
}

TEST_CASE("EtcdStore add is atomic across clients", "[etcd][store]") {
  EtcdProcess etcd;
  constexpr int kThreads = 4, kEach = 25;
  std::vector<std::future<void>> adders;
  for (int t = 0; t < kThreads; ++t) {
    adders.push_back(std::async(std::launch::async, [&] {
      EtcdStore store(client_of(etcd), "/t/add", 2s);
      for (int i = 0; i < kEach; ++i) store.add("counter", 1);
    }));
  }
  for (auto& a : adders) a.get();
  EtcdStore store(client_of(etcd), "/t/add", 2s);
  CHECK(store.add("counter", 0) == kThreads * kEach);
}

TEST_CASE("EtcdStore waits for keys by watching, and times out naming them", "[etcd][store]") {
  EtcdProcess etcd;
  EtcdStore reader(client_of(etcd), "/t/wait", 10s);
  auto writer = std::async(std::launch::async, [&] {
    EtcdStore w(client_of(etcd), "/t/wait", 2s);
    std::this_thread::sleep_for(200ms);  // the reader is in its watch by then (or finds the key at once)
    w.set("late", "here");
    w.set("later", "too");
  });
  const auto started = std::chrono::steady_clock::now();
  CHECK(reader.get("late") == "here");
  reader.wait({"late", "later"});
  CHECK(std::chrono::steady_clock::now() - started < 5s);  // a bound, not a timing claim: no 10 s timeout hit
  writer.get();
  // Either of two names (torch 1.13's and 2.x's role info keys).
  auto found = reader.wait_any({{"absent", "later"}, {"late"}}, 1s);
  REQUIRE(found.size() == 2);
  CHECK(found[0].which == 1);
  CHECK(found[0].value == "too");
  reader.set_timeout(300ms);
  try {
    reader.get("never");
    FAIL("no timeout");
  } catch (const WaitTimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'never'"));
    CHECK_THAT(e.what(), Catch::Contains(etcd.endpoint().to_string()));
  }
  CHECK_THROWS_AS(reader.wait({"late", "never"}, 300ms), WaitTimeoutError);
}

TEST_CASE("EtcdStore refuses a value that is not base64, naming the etcd key", "[etcd][store]") {
  EtcdProcess etcd;
  auto client = client_of(etcd);
  client->write("/t/foreign/" + base64_encode("k"), "not base64!");
  EtcdStore store(client, "/t/foreign", 1s);
  try {
    store.get("k");
    FAIL("read a foreign value");
  } catch (const BadReplyError& e) {
    CHECK_THAT(e.what(), Catch::Contains("/t/foreign/" + base64_encode("k")));
    CHECK_THAT(e.what(), Catch::Contains("not base64!"));
  }
  client->write("/t/foreign/" + base64_encode("n"), base64_encode("seven"));
  CHECK_THROWS_WITH(store.add("n", 1), Catch::Contains("not a counter"));
}

TEST_CASE("torch's EtcdStore and ddprun's read each other's keys", "[etcd][store][torch]") {
  EtcdProcess etcd;
  EtcdStore store(client_of(etcd), "/t/interop", 5s);
  store.set("from_ddprun", std::string("bytes\0\x01", 7));
  store.add("count", 2);
  const std::string port = std::to_string(etcd.endpoint().port);
  const std::string out = python(
      "import datetime, etcd\n"
      "from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore\n"
      "s = EtcdStore(etcd.Client(\"127.0.0.1\", " +
      port +
      "), \"/t/interop\", datetime.timedelta(seconds=5))\n"
      "print(repr(s.get(\"from_ddprun\")))\n"
      "print(s.add(\"count\", 3))\n"
      "s.set(\"from_torch\", b\"torch\\x00value\")\n");
  CHECK_THAT(out, Catch::Contains("b'bytes\\x00\\x01'"));
  CHECK_THAT(out, Catch::Contains("5"));
  CHECK(store.get("from_torch") == std::string("torch\0value", 11));
  CHECK(store.add("count", 0) == 5);
}

}  // namespace
}  // namespace ddprun::rdzv::etcd
