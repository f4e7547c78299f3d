// DynamicRendezvous: torchrun's c10d backend on ddprun's store — elastic node counts (--nnodes MIN:MAX),
// node loss and node arrival, with rounds that cost O(N) messages in total.
//
// Protocol (docs/rendezvous.md has the sequence diagram). Keys, stored as "/ddprun/<run_id>/..." (see
// round_keys.h):
//   round                 the newest round that completed (decimal)
//   r<r>/joined           ADD counter: a joining node's arrival index is the value it gets back, minus one
//   r<r>/node/<idx>       the node's descriptor "<identity>|<previous node rank>|<local world
//   size>|<standby>"
//                         (standby: the endpoint of its standby store, "" when it has none)
//   r<r>/full             after a failover: every node expected to survive joined; ends the last call
//   r<r>/closed           the arrivals the round considered, written once (compare_set) by the closer
//   r<r>/assign/<idx>     "<node rank>|<nodes>|<base rank>|<world size>|<successors>", or "spare", written
//                         by the closer (multi_set); the successors to the store: StoreFailover::encode
//   r<r>/members          the round's identities in node-rank order, '|'-separated (the next closer reads it)
//   r<r>/dropped          the previous round's identities that are not in this one (and did not stand aside)
//   r<r>/lost/<node rank> a neighbour found that node silent (heartbeats), or it stood aside
//   r<r>/aside/<node rank> that node stood aside (cooldown, unhealthy): it is alive, not lost
//   unhealthy/<identity>  why that agent stands aside as unhealthy, until it joins again
//   live/<identity>       connection-bound: exists while the agent's connection to the store is open
//   r<r>/stop             RoundStop (first writer wins); r<r>/done, r<r>/left: counters as in the static
//   backend r<r>/hb/<node rank>   heartbeat counter of a running node (ADD 1 every keep_alive_interval)
//   failures/<identity>   how often this agent's workers caused a failure (cooldown; per agent, not per host:
//                         several agents may share a host, e.g. one Slurm task per GPU)
//   closed                the job is over
// Completion (dynamic_closing.cc has the rules): the node whose arrival makes the count MIN is the closer; it
// closes the round as soon as every living node of the previous round is back (a restart waits for nothing
// else), or MAX joined, or its last call ends. Every other node waits for r<r>/closed, and closes it itself
// if the closer vanished. Only the closer reads the descriptors (one MULTI_GET), chooses who takes part (the
// previous round's nodes first; at most MAX; the rest are "spare") and assigns node ranks (survivors keep
// theirs, spares take the freed ones); each node then WAITs for its own assignment. A node arriving after the
// close: if the round has room it ends the round (kMembership) so that everyone re-joins a bigger one; else
// it waits as a hot spare for the round to end. Liveness: an agent's connection-bound key live/<identity>
// (KeyValueState::connection_bound) disappears when its process dies; each running node also bumps its
// heartbeat and watches the next node's (ring order) with its own monotonic clock — no wall clocks are
// compared across hosts; a neighbour silent for keep_alive_interval x keep_alive_max_attempt is declared lost
// (r<r>/lost/<rank>, kMembership: a frozen node), and the survivors re-join.
//
// Errors (beyond RendezvousHandler's contract): next_rendezvous throws RendezvousTimeoutError when the store
// went away while this node waited for a round to complete (its host gave up, usually at its own join
// timeout), and RendezvousConflictError when the round this node waited for as a spare ended for good (done,
// or the store went away): this agent reused the run id and endpoint of another, running job.
// Stall tolerance: the watcher (wait_round_stopped, which also sends the heartbeats) rides out a store that
// does not answer, or cannot be reached, for up to read_timeout — the limit of one store request — and then
// reports RendezvousStoreError. A stall stops every node's heartbeats alike, so once the store answers again
// each node times its neighbour afresh: a stall is never taken for a node loss.
//
// Store failover (rendezvous/c10d/store_failover.h; this class's part of it is in dynamic_failover.cc; on
// unless
// --rdzv_conf failover=0, or MIN = MAX = 1): a lost store ends the round like a lost node (the watcher's or
// stop_round's result is a local kMembership stop), and the next next_rendezvous first moves to the round's
// first live successor, then forms the next round there; it closes as soon as every node expected to survive
// has joined. A node whose workers all succeeded (node_done) takes a lost store as the end of its round
// (kDone), as torchrun's exit barrier does. A store host that finds that its job moved on while it was
// unreachable ends its round with kShutdown, exit code 4 (job moved).
//
// Threads: the agent loop calls next_rendezvous/stop_round/node_done/...; its watcher thread calls
// wait_round_stopped. Each uses its own connection (RendezvousBase).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/c10d/loss_reporter.h"
#include "rendezvous/c10d/store_failover.h"
#include "rendezvous/rendezvous_base.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::rdzv {

// The exit code a store host's round ends with when its job moved on without it (the agent exits with it:
// agent/exit_codes.h kExitRendezvousFailed).
inline constexpr int kJobMovedExitCode = 4;

struct DynamicRendezvousOptions {
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  std::string endpoint_host = "localhost";
  uint16_t endpoint_port = 29400;
  // Tried in order after endpoint_host:endpoint_port when that does not serve the job (--rdzv_endpoint's
  // comma-separated list); a node whose host is the first endpoint joins the job there before hosting a new
  // store.
  std::vector<Endpoint> fallback_endpoints;
  bool failover = true;  // survive the store host's loss (store_failover.h); needs max_nodes > 1
  // This node's address for the others (its standby store); given, every store this agent hosts (the job's,
  // its standby) listens on it only. "" = found by routing, the stores on every interface.
  std::string local_addr;
  // StoreServerOptions::memory_budget of the stores this agent hosts, the job's and its standby (0: default).
  size_t store_memory_budget = 0;
  // The job's secret (--rdzv_secret_file; store_auth.h) for the stores this agent hosts and its connections,
  // the standby's included; null: none (not used with external_store).
  std::shared_ptr<const StoreAuth> auth;
  // Host the store: explicitly (is_host=1/0) or, when unset, if the endpoint is an address of this machine.
  std::optional<bool> is_host;
  std::string identity;  // unique per agent; default "<hostname>:<pid>"
  std::string host;      // this node's host name, for the default identity; default gethostname()
  std::chrono::milliseconds join_timeout{600000};
  std::chrono::milliseconds last_call_timeout{30000};
  std::chrono::milliseconds close_timeout{30000};
  std::chrono::milliseconds keep_alive_interval{5000};
  int keep_alive_max_attempt = 3;
  std::chrono::milliseconds read_timeout{60000};  // one store request; the watcher's stall tolerance
  std::chrono::milliseconds progress_interval{5000};
  std::chrono::milliseconds cooldown_base{10000};  // a host that failed twice sits out this long, doubling
  std::chrono::milliseconds cooldown_max{300000};
  // A store that is not ddprun's (--rdzv_backend etcd-v2: etcd): makes a connection whose requests wait up to
  // the given timeout; called twice (the agent loop's, the watcher's). When set, endpoint_host/port name the
  // store's first member only to find this node's address towards it (the workers' store address), and
  // fallback_endpoints, is_host, failover and store_memory_budget are not used: nothing is hosted, there is
  // no standby (the store is replicated by itself), and the workers' rank 0 hosts their TCPStore on a free
  // port of node 0's host (RendezvousInfo::agent_store false), which node 0 publishes as r<r>/workers_store.
  std::function<std::unique_ptr<Store>(std::chrono::milliseconds request_timeout)> external_store;
  std::string external_name;  // the store in messages ("etcd http://h1:2379,h2:2379")
};

class DynamicRendezvous final : public RendezvousBase {
 public:
  // Starts the store when this node hosts it (BindError only with is_host=1: otherwise a taken port means
  // another agent on this machine hosts it, and this one joins it), then connects (RendezvousStoreError
  // naming the endpoint when it cannot be reached within join_timeout).
  explicit DynamicRendezvous(DynamicRendezvousOptions options);
  ~DynamicRendezvous() override;

 protected:
  RendezvousInfo do_next_rendezvous(int local_world_size) override;
  void do_note_local_failure() override;
  // The members of the round whose connection-bound live key is gone (their agents died); own store only.
  std::vector<int> do_lost_nodes() override;
  // Steps aside (step_aside) and records the reason under unhealthy/<identity> until the next join.
  void do_stand_aside(const std::string& reason) override;
  std::string identity() const override { return options_.identity; }
  // Sends the heartbeat when it is due, then waits for the round's stop until the next one is.
  std::optional<RoundStop> watch_step(Clock::time_point deadline) override;
  std::optional<RoundStop> do_wait_round_stopped(std::chrono::milliseconds timeout) override;
  RoundStop do_stop_round(const RoundStop& stop) override;
  void do_shutdown() override;
  bool store_gone() override;
  void do_node_done() override;

 private:
  std::string key(const std::string& k) const { return keys_.key(k); }
  std::string round_key(int round, const std::string& k) const { return keys_.round_key(round, k); }
  bool failover_on() const { return options_.failover && options_.max_nodes > 1 && !external(); }
  bool external() const { return static_cast<bool>(options_.external_store); }
  // Node 0 publishes where its workers' rank 0 hosts their store; every node reads it (external store only).
  void share_workers_store(int r, RendezvousInfo& info);
  std::chrono::milliseconds heartbeat_timeout() const {
    return options_.keep_alive_interval * options_.keep_alive_max_attempt;
  }
  Timeouts timeouts() const;
  // Connects to the job's store: the endpoint, or with fallback endpoints the first that serves the job.
  void connect_to_job();
  // Starts the standby store (failover on and this agent does not host the store).
  void start_standby();
  // The store is lost: the local stop that ends the round, and next_rendezvous fails over first.
  RoundStop lose_store(const std::string& why);
  // Moves this agent to the store that takes over from the lost one (StoreFailover::take_over).
  void fail_over();
  RendezvousInfo join(int local_world_size);
  int current_round();
  // A node whose workers caused two or more failures sits out (cooldown) when another node can take its
  // place: MIN < MAX, or a spare waits.
  void sit_out_if_failing();
  // The next round's closer does not wait for this live node: its rank in the current round is marked lost
  // and its live key deleted (join() announces it again).
  void step_aside();
  // Whether an arrival of this node's last round that is not one of its members (a spare) is still alive.
  bool spare_waiting();
  // Adds this node to round r; returns its arrival index.
  int64_t join_round(int r, int local_world_size);
  // Sets this agent's connection-bound key live/<identity> (own store only): the round's closer knows this
  // agent alive while its connection is open (dynamic_closing.cc).
  void announce_alive();
  // Waits until round r is closed (closing it when this node is the closer, or the closer vanished); returns
  // how many arrivals the round considered.
  int64_t wait_closed_or_close(int r, int64_t index);
  // The closer's wait: closes round r as soon as it is complete (dynamic_closing.cc says when).
  void close_when_ready(int r);
  // Round r's identities in node-rank order (r<r>/members), read through `store`; empty when unknown.
  std::vector<std::string> members_of(Store& store, int r) const;
  // What the closer learned of the previous round's missing members' heartbeats.
  struct LivenessWatch {
    std::map<int, std::pair<int64_t, Clock::time_point>> beats;  // rank -> counter, when it last changed
    Clock::time_point next_heartbeat_check{};
  };
  // Removes from `missing` (identity -> rank in round r-1) the members known gone: live key gone, marked
  // lost, or heartbeat counter still for the heartbeat timeout.
  void drop_gone(int r, std::map<std::string, int>& missing, LivenessWatch& watch);
  // Closes round r over its first `arrivals` arrivals unless another node did; the closer assigns ranks.
  void close_round(int r, int64_t arrivals);
  void assign_ranks(int r, int64_t arrivals);
  RendezvousTimeoutError too_few_nodes(int r, int64_t joined) const;
  // This node's assignment in round r; nullopt when the closer vanished (round r is then stopped) or this
  // node was left out as a spare (it waited for the round to end: after_close).
  std::optional<RendezvousInfo> await_assignment(int r, int64_t index, Clock::time_point deadline);
  // This node came too late for round r, closed with `count` nodes, or was left out as a spare: ends the
  // round when it has room, else waits as a spare until it ends.
  void after_close(int r, int count, Clock::time_point deadline);
  // For the store host: the local stop that says the job moved on without it, once the round's successors
  // say so (asks them unless it is known already; then every later call returns it).
  std::optional<RoundStop> job_moved();
  std::optional<RoundStop> moved() const;
  // Sends this node's heartbeat and times its neighbour's; a local stop when this node's job moved on.
  std::optional<RoundStop> heartbeat_and_check();

  DynamicRendezvousOptions options_;
  int previous_rank_ = -1;
  bool unhealthy_ = false;  // stood aside as unhealthy; the next join deletes unhealthy/<identity>
  // End the round when one of the job's agents' connections closes (loss_reporter.h): on the store host, for
  // its store; on the others, for their standby (declared before failover_: the standby's server, which calls
  // the reporter's hook, stops first).
  std::unique_ptr<LossReporter> loss_reporter_;
  std::unique_ptr<LossReporter> standby_reporter_;
  Endpoint store_at_;  // where the job's store is now (MASTER_ADDR:MASTER_PORT of the workers)
  StoreFailover failover_;
  std::vector<Endpoint> successors_;     // of the last round this node ran in
  int without_standby_ = 0;              // members of that round that could not take over
  std::atomic<bool> store_lost_{false};  // set by the watcher or stop_round; next_rendezvous fails over
  mutable std::mutex moved_mu_;          // the watcher and the agent loop both may find the job moved
  std::optional<RoundStop> moved_;       // guarded by moved_mu_: this store host's job moved on without it
  int expected_nodes_ = 0;               // after a failover: the survivors that will join (0: unknown)
  std::atomic<int> done_round_{-1};      // the round in which this node's workers all succeeded
  // Heartbeat state, watcher thread only (reset by next_rendezvous before the watcher starts).
  Clock::time_point next_beat_{};
  int64_t neighbour_beats_ = -1;
  Clock::time_point neighbour_seen_{};
  // The watcher ran late by more than half the heartbeat timeout in this round: this process or its host
  // stalled (SIGSTOP, a frozen VM), and the others may have moved the job meanwhile.
  Clock::time_point watched_{};       // the end of the watcher's last step
  std::atomic<bool> stalled_{false};  // read by next_rendezvous too
};

}  // namespace ddprun::rdzv
