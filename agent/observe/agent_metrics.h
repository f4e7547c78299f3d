// AgentMetrics: what the agent's /metrics shows (agent/observe/metrics_server.h; docs/observability.md lists
// every metric), kept in a prometheus-cpp registry and written in Prometheus' text format by its
// TextSerializer. Counters follow events (a rendezvous, a worker's exit, a round's end); gauges are set by
// refresh() from the group, the agent's own process and, on the node that hosts it, the store.
//
// Threads: the agent loop updates; the metrics server's thread calls text(). prometheus-cpp's metrics are
// thread-safe; refresh() and text() also take a mutex for the per-rank families they add and remove.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "agent/observe/rank_sample.h"
#include "agent/observe/straggler_tracker.h"
#include "agent/process/worker_launch.h"
#include "agent/worker_group.h"
#include "rendezvous/store/store_stats.h"

namespace ddprun::agent {

// A metric's name and help text (agent_metrics.cc has the table).
struct MetricSpec {
  const char* name;
  const char* help;
};

class AgentMetrics {
 public:
  AgentMetrics();

  void rendezvous_done(std::chrono::duration<double> took);
  void worker_exited(const ExitStatus& status);
  // A round ended: "failure" (a counted restart follows), "membership", "signal", "done", "exit".
  void round_ended(const std::string& reason);
  // Gauges: restarts counted so far, the group's workers (nullptr: none run) with this tick's samples of
  // them (rank_sample.h, in the group's order), the store this agent hosts, the ranks this agent flags as
  // stragglers (node rank 0 only; agent/observe/straggler_watch.h).
  void refresh(int restarts_done, const WorkerGroup* group, const std::vector<RankSample>& samples,
               const std::optional<rdzv::StoreServerStats>& store,
               const std::map<int, StragglerEpisode>& stragglers);
  std::string text();

 private:
  // A family of `m`'s name and help, registered in registry_.
  prometheus::Family<prometheus::Counter>& counter(const MetricSpec& m);
  prometheus::Family<prometheus::Gauge>& gauge(const MetricSpec& m);
  prometheus::Family<prometheus::Histogram>& histogram(const MetricSpec& m);
  // Parts of refresh(), under mu_.
  void refresh_ranks(const WorkerGroup* group, const std::vector<RankSample>& samples);
  void refresh_stragglers(const std::map<int, StragglerEpisode>& stragglers);
  void refresh_store(const rdzv::StoreServerStats& store);

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::mutex mu_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& rounds_;
  prometheus::Family<prometheus::Counter>& exits_;
  prometheus::Family<prometheus::Histogram>& rendezvous_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& progress_age_;
  prometheus::Family<prometheus::Gauge>& step_time_;
  prometheus::Family<prometheus::Gauge>& before_collective_;
  prometheus::Family<prometheus::Gauge>& stragglers_;
  prometheus::Family<prometheus::Counter>& straggler_episodes_;
  prometheus::Family<prometheus::Counter>& cpu_;
  prometheus::Family<prometheus::Gauge>& rss_;
  prometheus::Family<prometheus::Gauge>& store_connections_;
  prometheus::Family<prometheus::Counter>& store_requests_;
  prometheus::Family<prometheus::Gauge>& store_held_;
  prometheus::Family<prometheus::Gauge>& store_budget_;
  prometheus::Family<prometheus::Counter>& store_dropped_;
  prometheus::Family<prometheus::Counter>& store_refused_;
  int restarts_seen_ = 0;
  double cpu_seen_ = 0;
  std::array<uint64_t, rdzv::kOpCount> store_requests_seen_{};
  uint64_t store_dropped_seen_ = 0, store_refused_seen_ = 0;
  prometheus::Histogram* rendezvous_hist_ = nullptr;
  std::vector<std::pair<prometheus::Family<prometheus::Gauge>*, prometheus::Gauge*>>
      rank_series_;                                     // of ranks_round_
  int ranks_round_ = -1;                                // the round whose per-rank gauges exist
  std::map<int, prometheus::Gauge*> straggler_series_;  // rank -> its ddprun_straggler series
};

}  // namespace ddprun::agent
