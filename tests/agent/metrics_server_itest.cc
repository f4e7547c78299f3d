// The agent's HTTP endpoint (agent/observe/metrics_server.h) on 127.0.0.1, spoken to as Prometheus and the
// kubelet do: /metrics with the registry's text (agent/observe/agent_metrics.h), /healthz, /readyz, and what
// it refuses.
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

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

  // --state_memory: a rank's series go when it is no longer this node's (another round); a rank without a
  // copy at the buddy has no replica series.
  metrics.refresh_state(StateStats{
      .ranks = {{.rank = 2, .step = 40, .replica_step = 30}, {.rank = 3, .step = 40}}, .bytes_held = 4096});
  body = std::get<2>(request(server.port(), http::verb::get, "/metrics"));
  CHECK_THAT(body, Catch::Contains("ddprun_state_step{rank=\"2\"} 40\n") &&
                       Catch::Contains("ddprun_state_step{rank=\"3\"} 40\n") &&
                       Catch::Contains("ddprun_state_replica_step{rank=\"2\"} 30\n") &&
                       Catch::Contains("ddprun_state_bytes 4096\n"));
  CHECK_THAT(body, !Catch::Contains("ddprun_state_replica_step{rank=\"3\"}"));
  metrics.refresh_state(StateStats{.ranks = {{.rank = 0, .step = 50}}, .bytes_held = 8192});
  body = std::get<2>(request(server.port(), http::verb::get, "/metrics"));
  CHECK_THAT(body, Catch::Contains("ddprun_state_step{rank=\"0\"} 50\n") &&
                       !Catch::Contains("ddprun_state_step{rank=\"2\"}") &&
                       !Catch::Contains("ddprun_state_replica_step{rank="));

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
