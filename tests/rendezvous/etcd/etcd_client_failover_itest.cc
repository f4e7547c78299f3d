// EtcdClient (rendezvous/etcd/etcd_client.h) when members fail and when a server is not etcd, against real
// etcd 3.4 members (etcd_process.h) that are killed and restarted, a port nobody listens on, a listening
// socket that never answers, a member without the v2 API and a real non-etcd HTTP server (python3 -m
// http.server): the request goes to the next member and stays with the one that answered; no member
// answering is EtcdUnavailableError naming each one and why, within the request timeout; a kept connection
// to a restarted member is replaced; a watch goes on after its member was lost and reports a member lost for
// good as unavailable at its timeout; a server that is not etcd's v2 API is EtcdProtocolError naming it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <optional>
#include <string>

#include "catch_compat.h"
#include "child_processes.h"
#include "etcd_client_fixture.h"
#include "etcd_process.h"
#include "eventually.h"
#include "rendezvous/etcd/etcd_client.h"
#include "temp_dir.h"

namespace ddprun::rdzv::etcd {
namespace {

using namespace client_fixture;
using testing::EtcdProcess;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

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

}  // namespace
}  // namespace ddprun::rdzv::etcd
