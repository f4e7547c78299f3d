// The agent's HTTP endpoint (agent/observe/metrics_server.h) on 127.0.0.1, spoken to as Prometheus and the
// kubelet do: /metrics with the registry's text (agent/observe/agent_metrics.h), /healthz, /readyz, and what
// it refuses.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "agent/observe/agent_metrics.h"
#include "agent/observe/metrics_server.h"
#include "catch_compat.h"

using namespace ddprun::agent;
namespace http = boost::beast::http;

namespace {

// One request on a fresh connection: (status, content type, body).
std::tuple<int, std::string, std::string> request(uint16_t port, http::verb verb, const std::string& target) {
  boost::asio::io_context io;
  boost::beast::tcp_stream stream(io);
  stream.connect({boost::asio::ip::make_address("127.0.0.1"), port});
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  http::write(stream, req);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res);
  return {static_cast<int>(res.result_int()), std::string(res[http::field::content_type]), res.body()};
}

}  // namespace

TEST_CASE("metrics server: /metrics, /healthz, /readyz, and nothing else", "[agent][metrics]") {
  AgentMetrics metrics;
  std::atomic<bool> ready{false};
  MetricsServer server(
      "127.0.0.1", 0, [&] { return metrics.text(); }, [&] { return ready.load(); });
  REQUIRE(server.port() != 0);

  metrics.worker_exited(ExitStatus{.exit_code = 3});
  metrics.worker_exited(ExitStatus{.signal = 9});
  metrics.round_ended("failure");
  metrics.rendezvous_done(std::chrono::milliseconds(120));
  ddprun::rdzv::StoreServerStats store{
      .connections = 4, .unauthorized = 2, .requests = 10, .memory_budget = 1024};
  store.requests_by_op[static_cast<size_t>(ddprun::rdzv::Op::kSet)] = 7;
  store.requests_by_op[static_cast<size_t>(ddprun::rdzv::Op::kMultiGet)] = 3;
  std::map<int, ddprun::agent::StragglerEpisode> stragglers{
      {5, {.rank = 5, .host = "node-b", .flagged = true}}};
  metrics.refresh(1, nullptr, {}, store, stragglers);
  auto [status, type, body] = request(server.port(), http::verb::get, "/metrics");
  CHECK(status == 200);
  CHECK(type == "text/plain; version=0.0.4; charset=utf-8");
  CHECK_THAT(body, Catch::Contains("ddprun_restarts_total 1\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_worker_exits_total{code=\"3\"} 1\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_worker_exits_total{signal=\"SIGKILL\"} 1\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_rounds_total{reason=\"failure\"} 1\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_rendezvous_duration_seconds_bucket{le=\"0.25\"} 1\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_store_connections 4\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_store_requests_total{op=\"set\"} 7\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_store_requests_total{op=\"multi_get\"} 3\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_store_memory_budget_bytes 1024\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_store_clients_refused_total 2\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_straggler{host=\"node-b\",rank=\"5\"} 1\n"));
  CHECK_THAT(body, Catch::Contains("ddprun_straggler_episodes_total 1\n"));
  // Counters only grow: a second refresh with the same totals adds nothing; an episode that ended goes.
  store.connections = 2;
  metrics.refresh(1, nullptr, {}, store, {});
  body = std::get<2>(request(server.port(), http::verb::get, "/metrics"));
  CHECK_THAT(body, Catch::Contains("ddprun_store_requests_total{op=\"set\"} 7\n") &&
                       Catch::Contains("ddprun_restarts_total 1\n") &&
                       Catch::Contains("ddprun_straggler_episodes_total 1\n"));
  CHECK_THAT(body, !Catch::Contains("ddprun_straggler{"));

  CHECK(std::get<0>(request(server.port(), http::verb::get, "/healthz")) == 200);
  CHECK(std::get<0>(request(server.port(), http::verb::get, "/readyz")) == 503);
  ready = true;
  CHECK(std::get<0>(request(server.port(), http::verb::get, "/readyz?verbose")) == 200);
  CHECK(std::get<0>(request(server.port(), http::verb::get, "/other")) == 404);
  CHECK(std::get<0>(request(server.port(), http::verb::post, "/metrics")) == 405);
}

TEST_CASE("metrics server: a port in use is an error naming it", "[agent][metrics]") {
  MetricsServer first(
      "127.0.0.1", 0, [] { return std::string(); }, [] { return true; });
  const std::string where = "127.0.0.1:" + std::to_string(first.port());
  CHECK_THROWS_WITH(MetricsServer(
                        "127.0.0.1", first.port(), [] { return std::string(); }, [] { return true; }),
                    Catch::Contains("cannot serve metrics on " + where));
}

namespace {

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

TEST_CASE("metrics server: out of descriptors, it waits for them instead of spinning, then serves again",
          "[agent][metrics]") {
  MetricsServer server(
      "127.0.0.1", 0, [] { return std::string("m 1\n"); }, [] { return true; });
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);  // made before the descriptors run out
  REQUIRE(client >= 0);
  const timeval bound{.tv_sec = 20, .tv_usec = 0};  // every read below ends by then
  ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  rlimit before{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &before) == 0);
  rlimit low = before;
  low.rlim_cur = 512;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> hoard;  // every descriptor left: the server's accept fails with EMFILE
  for (int fd; (fd = ::dup(client)) >= 0;) hoard.push_back(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server.port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);  // waits in the backlog
  // A bound on CPU, not a measure of time: an accept retried at once kept a core busy (about 1 s of CPU in
  // this 1 s); retried every 100 ms it costs next to nothing.
  const double cpu0 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double spent = process_cpu_seconds() - cpu0;
  for (int fd : hoard) ::close(fd);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &before) == 0);
  CHECK(spent < 0.1);
  // Descriptors back: the waiting connection is served.
  const std::string get = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  REQUIRE(::write(client, get.data(), get.size()) == static_cast<ssize_t>(get.size()));
  std::string reply;
  char buf[512];
  for (ssize_t n; (n = ::read(client, buf, sizeof buf)) > 0;) reply.append(buf, static_cast<size_t>(n));
  ::close(client);
  CHECK_THAT(reply, Catch::StartsWith("HTTP/1.1 200"));
}
