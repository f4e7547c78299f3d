// etcd's v2 client (rendezvous/etcd/etcd_client.h) against real etcd 3.4 members (etcd_process.h), a real
// non-etcd HTTP server (python3 -m http.server) and a listening socket that never answers.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "child_processes.h"
#include "etcd_process.h"
#include "eventually.h"
#include "rendezvous/etcd/etcd_client.h"
#include "temp_dir.h"

namespace ddprun::rdzv::etcd {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::EtcdProcess;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

// One member for the tests that only read and write keys (each under a prefix of its own): started once.
EtcdProcess& shared_etcd() {
  static EtcdProcess etcd;
  return etcd;
}

ClientOptions options_for(std::vector<Endpoint> endpoints, std::chrono::milliseconds timeout = 2000ms) {
  ClientOptions options;
  options.endpoints = std::move(endpoints);
  options.request_timeout = timeout;
  return options;
}

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

// A plain GET with a 2 s deadline: the reply, or nullopt when nothing answered.
std::optional<http::response<http::string_body>> http_get(const Endpoint& endpoint,
                                                          const std::string& target) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.expires_after(2s);
  beast::error_code ec;
  beast::flat_buffer buffer;
  http::request<http::empty_body> request{http::verb::get, target, 11};
  request.set(http::field::host, endpoint.to_string());
  http::response<http::string_body> response;
  stream.async_connect(asio::ip::tcp::endpoint(asio::ip::make_address(endpoint.host), endpoint.port),
                       [&](beast::error_code e) {
                         if ((ec = e)) return;
                         http::async_write(stream, request, [&](beast::error_code e2, std::size_t) {
                           if ((ec = e2)) return;
                           http::async_read(stream, buffer, response,
                                            [&](beast::error_code e3, std::size_t) { ec = e3; });
                         });
                       });
  ioc.run();
  if (ec) return std::nullopt;
  return response;
}

// A listening socket on a free port that accepts no connection: the kernel completes the handshakes, nothing
// ever answers.
class SilentServer {
 public:
  SilentServer() : acceptor_(ioc_, {asio::ip::make_address("127.0.0.1"), 0}) {}
  Endpoint endpoint() const { return {"127.0.0.1", acceptor_.local_endpoint().port()}; }

 private:
  asio::io_context ioc_;
  asio::ip::tcp::acceptor acceptor_;
};

// python3 -m http.server on a free port, serving `root`: an HTTP server that is not etcd.
class PythonHttpServer {
 public:
  explicit PythonHttpServer(const std::filesystem::path& root) : port_(testing::free_port()) {
    child_ = testing::spawn_child({"/usr/bin/python3", "-m", "http.server", "--bind", "127.0.0.1",
                                   "--directory", root.string(), std::to_string(port_)},
                                  {});
    REQUIRE(testing::eventually([&] { return http_get(endpoint(), "/").has_value(); }, 20s));
  }
  ~PythonHttpServer() {
    ::kill(-child_.pid, SIGKILL);
    ::waitpid(child_.pid, nullptr, 0);
    ::close(child_.fd);
  }
  Endpoint endpoint() const { return {"127.0.0.1", port_}; }

 private:
  uint16_t port_;
  testing::Child child_;
};

template <typename F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

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

TEST_CASE("etcd: a dead member first: the live one answers, and later requests stay with it",
          "[etcd][failover]") {
  SilentServer silent;  // answers nothing: each request to it costs the whole request timeout
  const uint16_t dead = testing::free_port();
  Client client(options_for({silent.endpoint(), {"127.0.0.1", dead}, shared_etcd().endpoint()}, 500ms));
  CHECK(client.endpoints_text() == silent.endpoint().to_string() + ",127.0.0.1:" + std::to_string(dead) +
                                       "," + shared_etcd().endpoint().to_string());
  auto before = Clock::now();
  CHECK(client.write("/t/failover/k", "v").node.value == "v");
  CHECK(since(before) >= 500ms);
  CHECK(client.current_endpoint() == shared_etcd().endpoint().to_string());
  before = Clock::now();
  for (int i = 0; i < 5; ++i) CHECK(client.get("/t/failover/k").node.value == "v");
  CHECK(since(before) < 500ms);  // no request went to the silent member again
  CHECK(client.current_endpoint() == shared_etcd().endpoint().to_string());
}

TEST_CASE("etcd: no member answers: EtcdUnavailableError names each one", "[etcd][failover]") {
  const Endpoint a{"127.0.0.1", testing::free_port()};
  SilentServer silent;
  Client client(options_for({a, silent.endpoint()}, 400ms));
  const auto before = Clock::now();
  std::string message;
  try {
    client.get("/t/unavailable");
    FAIL("a request without a member succeeded");
  } catch (const EtcdUnavailableError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(since(before) >= 400ms);
  CHECK(since(before) < 2 * 400ms + 500ms);
  CHECK_THAT(message, Catch::Contains("no etcd member answered"));
  CHECK_THAT(message, Catch::Contains(a.to_string() + ": connection refused"));
  CHECK_THAT(message, Catch::Contains(silent.endpoint().to_string() + ": no answer within 400 ms"));
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
  const int time_wait = connections_to(etcd.endpoint().port).second;
  {
    Client client(options_for({etcd.endpoint()}));
    for (int i = 0; i < 20; ++i) {
      client.write("/t/keepalive/k", std::to_string(i));
      CHECK(client.get("/t/keepalive/k").node.value == std::to_string(i));
    }
    CHECK(connections_to(etcd.endpoint().port) == std::pair{1, time_wait});
  }
  CHECK(connections_to(etcd.endpoint().port) == std::pair{0, time_wait + 1});  // the destructor closed it
}

TEST_CASE("etcd: a kept connection to a restarted member is replaced", "[etcd][failover]") {
  EtcdProcess etcd;
  Client client(options_for({etcd.endpoint()}));
  client.write("/t/restart/k", "v");
  etcd.restart();
  CHECK(client.get("/t/restart/k").node.value == "v");
  etcd.kill();
  CHECK_THROWS_AS(client.get("/t/restart/k"), EtcdUnavailableError);
}

// True once `member` counts one watcher (no event says that a watch waits there: poll its metrics).
bool watching_at(const Endpoint& member) {
  std::string last;
  const bool watching = testing::eventually([&] {
    const auto metrics = http_get(member, "/metrics");
    if (!metrics) return false;
    const auto at = metrics->body().find("\netcd_debugging_store_watchers ");
    last = at == std::string::npos ? "no etcd_debugging_store_watchers" : metrics->body().substr(at + 1, 40);
    return last.rfind("etcd_debugging_store_watchers 1\n", 0) == 0;
  });
  UNSCOPED_INFO("etcd's metrics: " << last);
  return watching;
}

TEST_CASE("etcd: a watch goes on after its member was lost, within its timeout", "[etcd][watch][failover]") {
  EtcdProcess etcd;
  Client client(options_for({etcd.endpoint()}));
  const Response start = client.write("/t/lost/k", "0");
  // The watch waits on the member; the member dies and comes back; then the key changes.
  auto watcher = std::async(std::launch::async, [&] {
    Client watching(options_for({etcd.endpoint()}));
    return watching.watch("/t/lost/k", start.etcd_index + 1, false, 15s);
  });
  REQUIRE(watching_at(etcd.endpoint()));
  etcd.kill();
  etcd.restart();
  Client(options_for({etcd.endpoint()})).write("/t/lost/k", "after");
  const auto changed = watcher.get();
  REQUIRE(changed.has_value());
  CHECK(changed->node.value == "after");

  // A member lost for good during a watch: at its timeout the watch says the cluster is unavailable, not
  // "no change".
  auto lost = std::async(std::launch::async, [&] {
    Client watching(options_for({etcd.endpoint()}));
    return error_text([&] { watching.watch("/t/lost/k", changed->node.modified_index + 1, false, 1500ms); });
  });
  REQUIRE(watching_at(etcd.endpoint()));
  etcd.kill();
  const auto killed = Clock::now();
  const std::string message = lost.get();
  CHECK(since(killed) < 2s);
  CHECK(message == "no etcd member answered within the watch's 1.5 s: " + etcd.endpoint().to_string() +
                       ": connection refused");

  // A member gone before the watch starts: unavailable at once.
  const auto before = Clock::now();
  CHECK_THAT(
      error_text([&] { client.watch("/t/lost/k", start.etcd_index + 1000, false, 5s); }),
      Catch::Contains("no etcd member answered: " + etcd.endpoint().to_string() + ": connection refused"));
  CHECK(since(before) < 1s);
}

TEST_CASE("etcd: a member without the v2 API says --enable-v2=true", "[etcd][protocol]") {
  testing::EtcdProcessOptions v3_only;
  v3_only.enable_v2 = false;
  EtcdProcess etcd(v3_only);
  Client client(options_for({etcd.endpoint()}));
  std::string message;
  try {
    client.get("/t/v2off");
    FAIL("a member without v2 answered");
  } catch (const EtcdProtocolError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains(etcd.endpoint().to_string() + " does not serve etcd's v2 API"));
  CHECK_THAT(message,
             Catch::Contains("HTTP 404 for /v2/keys/t/v2off") && Catch::Contains("--enable-v2=true"));
  CHECK_THROWS_AS(client.write("/t/v2off", "v"), EtcdProtocolError);
}

TEST_CASE("etcd: an HTTP server that is not etcd is a protocol error naming it", "[etcd][protocol]") {
  testing::TempDir root;
  std::filesystem::create_directories(root.path / "v2" / "keys");
  root.write("v2/keys/page", "<html><body>not etcd</body></html>\n");
  root.write("v2/keys/json", "{\"hello\": 1}\n");
  PythonHttpServer server(root.path);
  const std::string name = server.endpoint().to_string();
  Client client(options_for({server.endpoint()}));
  const std::string html = error_text([&] { client.get("/page"); });
  CHECK_THAT(html, Catch::Contains(name) && Catch::Contains("/page") && Catch::Contains("HTTP 200") &&
                       Catch::Contains("not JSON"));
  const std::string json = error_text([&] { client.get("/json"); });
  CHECK_THAT(json, Catch::Contains(name) && Catch::Contains("HTTP 200"));
  const std::string put = error_text([&] { client.write("/page", "v"); });
  CHECK_THAT(put, Catch::Contains(name) && Catch::Contains("HTTP 501"));
  const std::string missing = error_text([&] { client.get("/missing"); });
  CHECK_THAT(missing, Catch::Contains(name + " does not serve etcd's v2 API"));
  CHECK_THROWS_AS(client.get("/page"), EtcdProtocolError);
}

TEST_CASE("etcd: a server that accepts and never answers times out", "[etcd][failover]") {
  SilentServer silent;
  Client client(options_for({silent.endpoint()}, 300ms));
  const auto before = Clock::now();
  const std::string message = error_text([&] { client.write("/t/silent", "v"); });
  CHECK(since(before) >= 300ms);
  CHECK(since(before) < 1500ms);
  CHECK(message == "no etcd member answered: " + silent.endpoint().to_string() + ": no answer within 300 ms");
  CHECK_THROWS_AS(client.get("/t/silent"), EtcdUnavailableError);
}

TEST_CASE("etcd: no endpoints is an invalid argument", "[etcd]") {
  CHECK_THROWS_AS(Client(ClientOptions{}), std::invalid_argument);
}

// ---- TLS ------------------------------------------------------------------------------------------------

struct TlsMember {
  testing::TempDir dir;
  testing::TestPki pki = testing::make_test_pki(dir.path);
  EtcdProcess etcd{tls_options(pki)};

  static testing::EtcdProcessOptions tls_options(const testing::TestPki& pki) {
    testing::EtcdProcessOptions options;
    options.tls = testing::EtcdTls{pki.server_cert, pki.server_key, pki.ca_file, true};
    return options;
  }
  ClientOptions client_options(const std::filesystem::path& ca, const std::filesystem::path& cert,
                               const std::filesystem::path& key) const {
    ClientOptions options = options_for({etcd.endpoint()});
    options.https = true;
    options.tls = {ca.string(), cert.string(), key.string()};
    return options;
  }
};

TEST_CASE("etcd over TLS: certificates right, wrong, missing", "[etcd][tls]") {
  TlsMember member;
  const testing::TestPki& pki = member.pki;
  const std::string name = member.etcd.endpoint().to_string();

  SECTION("the right CA and a client certificate: it works") {
    Client client(member.client_options(pki.ca_file, pki.client_cert, pki.client_key));
    CHECK(client.write("/t/tls/k", "secret").action == "set");
    CHECK(client.get("/t/tls/k").node.value == "secret");
    const auto nothing = client.watch("/t/tls/k", client.get("/t/tls/k").etcd_index + 1, false, 200ms);
    CHECK_FALSE(nothing.has_value());
    CHECK(client.get("/t/tls/k").node.value == "secret");
  }
  SECTION("a CA that did not sign the member's certificate: certificate verify failed") {
    Client client(member.client_options(pki.other_ca_file, pki.client_cert, pki.client_key));
    std::string message;
    try {
      client.get("/t/tls/k");
      FAIL("a member with an unknown CA was trusted");
    } catch (const EtcdTlsError& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("certificate verify failed"));
  }
  SECTION("no client certificate for a member that requires one") {
    Client client(member.client_options(pki.ca_file, "", ""));
    std::string message;
    try {
      client.get("/t/tls/k");
      FAIL("a member that requires a client certificate answered without one");
    } catch (const EtcdTlsError& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("requires a client certificate"));
  }
  SECTION("a client certificate from another CA") {
    Client client(member.client_options(pki.ca_file, pki.other_client_cert, pki.other_client_key));
    const std::string message = error_text([&] { client.get("/t/tls/k"); });
    CHECK_THROWS_AS(client.get("/t/tls/k"), EtcdTlsError);
    CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("refused the client certificate"));
  }
  SECTION("plain http to a TLS member, https to a plain one") {
    Client plain(options_for({member.etcd.endpoint()}));
    const std::string to_tls = error_text([&] { plain.get("/t/tls/k"); });
    CHECK_THAT(to_tls, Catch::Contains(name));
    ClientOptions https = member.client_options(pki.ca_file, pki.client_cert, pki.client_key);
    https.endpoints = {shared_etcd().endpoint()};
    Client tls_to_plain(https);
    CHECK_THROWS_AS(tls_to_plain.get("/t/tls/k"), EtcdTlsError);
  }
}

TEST_CASE("etcd over TLS: a PEM file that cannot be read fails the constructor", "[etcd][tls]") {
  testing::TempDir dir;
  ClientOptions options = options_for({{"127.0.0.1", 1}});
  options.https = true;
  options.tls.ca_file = (dir.path / "missing-ca.pem").string();
  std::string message;
  try {
    Client client(options);
    FAIL("a client with a missing CA file was made");
  } catch (const EtcdTlsError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains(options.tls.ca_file) && Catch::Contains("No such file"));

  options.tls.ca_file = dir.write("garbage.pem", "not a certificate\n").string();
  message = error_text([&] { Client client(options); });
  CHECK_THAT(message, Catch::Contains(options.tls.ca_file));
  CHECK_THROWS_AS(Client(options), EtcdTlsError);

  options.tls.ca_file = "";
  options.tls.cert_file = (dir.path / "missing-cert.pem").string();
  CHECK_THAT(error_text([&] { Client client(options); }), Catch::Contains(options.tls.cert_file));
}

}  // namespace
}  // namespace ddprun::rdzv::etcd
