#include "agent/observe/agent_metrics.h"

#include <prometheus/text_serializer.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>

namespace ddprun::agent {

namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

double own_cpu_seconds() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double own_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Every metric this agent exports, by the member it makes (docs/observability.md lists them).
constexpr MetricSpec kRestarts{"ddprun_restarts_total",
                               "Restarts of the worker group counted against --max_restarts"};
constexpr MetricSpec kRounds{"ddprun_rounds_total", "Rounds this agent ran, by how they ended"};
constexpr MetricSpec kExits{"ddprun_worker_exits_total", "Worker exits, by exit code or signal"};
constexpr MetricSpec kRendezvous{"ddprun_rendezvous_duration_seconds",
                                 "Time from joining a round to its completion"};
constexpr MetricSpec kWorkers{"ddprun_workers", "This agent's workers, by state"};
constexpr MetricSpec kProgressAge{"ddprun_rank_progress_age_seconds",
                                  "Seconds since a local rank last wrote its $DDPRUN_PROGRESS_FILE"};
constexpr MetricSpec kStepTime{"ddprun_rank_step_seconds",
                               "A local rank's last step time, from its $DDPRUN_PROGRESS_FILE"};
constexpr MetricSpec kBeforeCollective{
    "ddprun_rank_before_collective_seconds",
    "A local rank's time before its last step's first collective, from its $DDPRUN_PROGRESS_FILE"};
constexpr MetricSpec kStragglers{
    "ddprun_straggler",
    "1 for each rank of the job flagged as a straggler (exported by the agent of node rank 0)"};
constexpr MetricSpec kStragglerEpisodes{"ddprun_straggler_episodes_total",
                                        "Straggler episodes begun (counted by the agent of node rank 0)"};
constexpr MetricSpec kCpu{"ddprun_agent_cpu_seconds_total",
                          "CPU time (user and system) of the agent process itself"};
constexpr MetricSpec kRss{"ddprun_agent_resident_memory_bytes",
                          "Resident memory of the agent process itself"};
constexpr MetricSpec kStoreConnections{"ddprun_store_connections",
                                       "Open connections to the store this agent hosts"};
constexpr MetricSpec kStoreRequests{"ddprun_store_requests_total",
                                    "Requests served by the store this agent hosts, by operation"};
constexpr MetricSpec kStoreHeld{
    "ddprun_store_held_bytes",
    "Bytes the store this agent hosts holds for its clients (see --store_memory_budget)"};
constexpr MetricSpec kStoreBudget{"ddprun_store_memory_budget_bytes", "The store's --store_memory_budget"};
constexpr MetricSpec kStoreDropped{
    "ddprun_store_clients_dropped_total",
    "Store clients closed for misbehaviour or for holding the most over the budget"};
constexpr MetricSpec kStoreRefused{
    "ddprun_store_clients_refused_total",
    "Store clients refused by a store with the job's secret (--rdzv_secret_file)"};

}  // namespace

prometheus::Family<prometheus::Counter>& AgentMetrics::counter(const MetricSpec& m) {
  return BuildCounter().Name(m.name).Help(m.help).Register(*registry_);
}
prometheus::Family<prometheus::Gauge>& AgentMetrics::gauge(const MetricSpec& m) {
  return BuildGauge().Name(m.name).Help(m.help).Register(*registry_);
}
prometheus::Family<prometheus::Histogram>& AgentMetrics::histogram(const MetricSpec& m) {
  return BuildHistogram().Name(m.name).Help(m.help).Register(*registry_);
}

AgentMetrics::AgentMetrics()
    : restarts_(counter(kRestarts)),
      rounds_(counter(kRounds)),
      exits_(counter(kExits)),
      rendezvous_(histogram(kRendezvous)),
      workers_(gauge(kWorkers)),
      progress_age_(gauge(kProgressAge)),
      step_time_(gauge(kStepTime)),
      before_collective_(gauge(kBeforeCollective)),
      stragglers_(gauge(kStragglers)),
      straggler_episodes_(counter(kStragglerEpisodes)),
      cpu_(counter(kCpu)),
      rss_(gauge(kRss)),
      store_connections_(gauge(kStoreConnections)),
      store_requests_(counter(kStoreRequests)),
      store_held_(gauge(kStoreHeld)),
      store_budget_(gauge(kStoreBudget)),
      store_dropped_(counter(kStoreDropped)),
      store_refused_(counter(kStoreRefused)) {
  restarts_.Add({});
  for (const char* reason : {"failure", "membership", "signal", "done", "exit"})
    rounds_.Add({{"reason", reason}});
  rendezvous_hist_ = &rendezvous_.Add(
      {}, prometheus::Histogram::BucketBoundaries{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300});
  for (const char* s : {"running", "succeeded", "failed", "stopped"}) workers_.Add({{"state", s}});
  cpu_.Add({});
  rss_.Add({});
  straggler_episodes_.Add({});
}

void AgentMetrics::rendezvous_done(std::chrono::duration<double> took) {
  rendezvous_hist_->Observe(took.count());
}

void AgentMetrics::worker_exited(const ExitStatus& status) {
  if (status.signal != 0) {
    exits_.Add({{"signal", signal_name(status.signal)}}).Increment();
  } else {
    exits_.Add({{"code", std::to_string(status.exit_code)}}).Increment();
  }
}

void AgentMetrics::round_ended(const std::string& reason) {
  rounds_.Add({{"reason", reason}}).Increment();
}

void AgentMetrics::refresh(int restarts_done, const WorkerGroup* group,
                           const std::vector<RankSample>& samples,
                           const std::optional<rdzv::StoreServerStats>& store,
                           const std::map<int, StragglerEpisode>& stragglers) {
  std::lock_guard lock(mu_);
  if (restarts_done > restarts_seen_) restarts_.Add({}).Increment(restarts_done - restarts_seen_);
  restarts_seen_ = restarts_done;
  const double cpu = own_cpu_seconds();
  if (cpu > cpu_seen_) cpu_.Add({}).Increment(cpu - cpu_seen_);
  cpu_seen_ = std::max(cpu, cpu_seen_);
  rss_.Add({}).Set(own_rss_bytes());
  refresh_ranks(group, samples);
  refresh_stragglers(stragglers);
  if (store) refresh_store(*store);
}

void AgentMetrics::refresh_ranks(const WorkerGroup* group, const std::vector<RankSample>& samples) {
  std::map<std::string, double> states{{"running", 0}, {"succeeded", 0}, {"failed", 0}, {"stopped", 0}};
  const int round = group ? group->round.round : -1;
  if (round != ranks_round_) {  // another round's ranks (or none): their series go
    for (auto [family, series] : rank_series_) family->Remove(series);
    rank_series_.clear();
  }
  ranks_round_ = round;
  auto set = [&](prometheus::Family<prometheus::Gauge>& family, const prometheus::Labels& labels, double v) {
    auto& series = family.Add(labels);
    series.Set(v);
    const std::pair<prometheus::Family<prometheus::Gauge>*, prometheus::Gauge*> entry{&family, &series};
    if (std::find(rank_series_.begin(), rank_series_.end(), entry) == rank_series_.end())
      rank_series_.push_back(entry);
  };
  if (group) {
    for (const Worker& w : group->workers) {
      states[worker_state_name(w.state)] += 1;
      const prometheus::Labels labels{{"rank", std::to_string(w.rank)},
                                      {"local_rank", std::to_string(w.local_rank)}};
      const size_t i = static_cast<size_t>(&w - group->workers.data());
      if (i >= samples.size()) continue;
      if (const auto& beat = samples[i].beat) {
        if (samples[i].age_s) set(progress_age_, labels, *samples[i].age_s);
        if (beat->step_s) set(step_time_, labels, *beat->step_s);
        if (beat->before_collective_s) set(before_collective_, labels, *beat->before_collective_s);
      }
    }
  }
  for (const auto& [s, n] : states) workers_.Add({{"state", s}}).Set(n);
}

void AgentMetrics::refresh_stragglers(const std::map<int, StragglerEpisode>& stragglers) {
  for (auto it = straggler_series_.begin(); it != straggler_series_.end();) {
    if (stragglers.count(it->first)) {
      ++it;
    } else {
      stragglers_.Remove(it->second);
      it = straggler_series_.erase(it);
    }
  }
  for (const auto& [rank, e] : stragglers) {
    if (straggler_series_.count(rank)) continue;
    auto& series = stragglers_.Add({{"rank", std::to_string(rank)}, {"host", e.host}});
    series.Set(1);
    straggler_series_[rank] = &series;
    straggler_episodes_.Add({}).Increment();
  }
}

void AgentMetrics::refresh_store(const rdzv::StoreServerStats& store) {
  store_connections_.Add({}).Set(static_cast<double>(store.connections));
  store_held_.Add({}).Set(static_cast<double>(store.buffered_bytes));
  store_budget_.Add({}).Set(static_cast<double>(store.memory_budget));
  for (size_t op = 0; op < rdzv::kOpCount; ++op) {
    const uint64_t n = store.requests_by_op[op];
    if (n <= store_requests_seen_[op]) continue;
    store_requests_.Add({{"op", lower(std::string(rdzv::op_name(static_cast<rdzv::Op>(op))))}})
        .Increment(static_cast<double>(n - store_requests_seen_[op]));
    store_requests_seen_[op] = n;
  }
  auto& dropped = store_dropped_.Add({});
  if (store.dropped > store_dropped_seen_)
    dropped.Increment(static_cast<double>(store.dropped - store_dropped_seen_));
  store_dropped_seen_ = store.dropped;
  auto& refused = store_refused_.Add({});
  if (store.unauthorized > store_refused_seen_)
    refused.Increment(static_cast<double>(store.unauthorized - store_refused_seen_));
  store_refused_seen_ = store.unauthorized;
}

std::string AgentMetrics::text() {
  std::lock_guard lock(mu_);
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace ddprun::agent
