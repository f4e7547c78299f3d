// MetricsServer: the agent's HTTP endpoint for Prometheus and Kubernetes (--metrics_port): GET /metrics (the
// text `metrics()` returns, Prometheus' text format 0.0.4), /healthz (200 while the agent runs: liveness) and
// /readyz (200 while `ready()` says its workers run in a formed round, else 503: readiness). Anything else
// is 404; other methods 405.
//
// Boost.Beast rather than prometheus-cpp's own Exposer: the Exposer (CivetWeb) serves only metric paths, not
// the two probes with their status codes. One thread runs the io_context; each connection is served one
// request at a time with keep-alive, and a client silent for 10 s is closed (a scraper cannot hold the
// agent). A failed accept (the process out of descriptors) is retried after 100 ms, not at once.
//
// Threads: the callbacks run on the server's thread and must be thread-safe. Construction throws
// std::system_error naming addr:port when it cannot listen.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ddprun::agent {

class MetricsServer {
 public:
  MetricsServer(const std::string& addr, uint16_t port, std::function<std::string()> metrics,
                std::function<bool()> ready);
  ~MetricsServer();  // stops and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
