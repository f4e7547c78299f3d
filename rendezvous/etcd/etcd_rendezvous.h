// EtcdRendezvous: torchrun's `etcd` backend (torch.distributed.elastic.rendezvous.etcd_rendezvous, the
// EtcdRendezvousHandler of torch 1.13 to 2.x) — the same protocol on the same keys, so that torchrun's agents
// and ddprun's meet in one job (docs/rendezvous.md "etcd").
//
// Keys, under "<etcd_prefix>/run_<run_id>" (default prefix /torchelastic/p2p), exactly as torch writes them:
//   (dir, TTL 2 h, refreshed)              the run's subroot
//   /rdzv/version_counter                  the last rendezvous version handed out ("1", "2", ...)
//   /rdzv/active_version                   JSON {"status": setup|joinable|frozen|final|closed,
//                                          "version": "<n>", "participants": [0, 1, ...], "keep_alives":
//                                          [keys], "num_workers_waiting": n}; TTLs as torch sets them; every
//                                          change is a compare-and-swap on the value read (prevValue)
//   /rdzv/v_<n>/rank_<r>                   node r's keep-alive (TTL 10 s, refreshed every 5 s)
//   /rdzv/v_<n>/kv/<base64 key>            the round's store (EtcdStore): what torch's agents then exchange —
//                                          MASTER_ADDR / MASTER_PORT (node 0 publishes a free port of its
//                                          host: the workers' rank 0 hosts their TCPStore there, as under
//                                          torchrun, TORCHELASTIC_USE_AGENT_STORE=False), the role infos and
//                                          ranks (torch 1.13's "torchelastic/role_info<r>" + ".FIN", 2.x's
//                                          "torchelastic/role_info/<r>" + "torchelastic/assigned_ranks/<r>":
//                                          ddprun writes and reads both, so it meets either version), and the
//                                          exit barrier ("torchelastic/agent/terminal_state<r>" for 1.13,
//                                          ".../num_members" and ".../last_member" for 2.x).
//   plus ddprun's own "ddprun/stop" in the round's store: why a round ended (RoundStop), which torch ignores.
// Phases as torch: a node creates or joins the joinable state; the MIN-th does the last call, the MAX-th
// freezes it; every node confirms with its keep-alive key; the last confirmation makes it final. A node that
// finds a final round announces itself (num_workers_waiting + 1) and waits for the round to be destroyed,
// which happens when a member's keep-alive key is gone. The running nodes see the announcement
// (torch's num_nodes_waiting) and restart their workers into the next rendezvous.
// Where ddprun differs (torch peers cannot tell): a node that enters the next rendezvous deletes its own
// keep-alive key instead of letting it expire, so the old round is destroyed at once instead of after 10 s;
// its watcher reports a member's keep-alive that expired (a lost node) as the end of the round; CAS retries
// wait 1-20 ms instead of 0-100 ms.
//
// Threads: as every RendezvousHandler (the agent loop; wait_round_stopped on the watcher thread), plus one
// lease thread that refreshes the TTLs. Each has its own etcd client. Errors: RendezvousHandler's; the etcd
// client's errors become RendezvousStoreError naming the endpoint and the key; a value under the run's keys
// that is not what torch writes is RendezvousStoreError naming the key ("another program uses ...").
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::rdzv::etcd {

class EtcdStore;
class LeaseKeeper;

struct EtcdRendezvousOptions {
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  ClientOptions client;                            // members, TLS, one request's timeout
  std::string prefix = "/torchelastic/p2p";        // --rdzv_conf etcd_prefix
  std::chrono::milliseconds join_timeout{600000};  // torch's `timeout`
  std::chrono::milliseconds last_call_timeout{30000};
  std::string local_addr;        // MASTER_ADDR when this node is node 0; "" = its address towards etcd
  std::string role = "default";  // the role torch's rank assignment groups by (--role)
};

class EtcdRendezvous final : public RendezvousHandler {
 public:
  // Creates the run's directories and the version counter (as torch's constructor); RendezvousStoreError
  // when etcd cannot be reached.
  explicit EtcdRendezvous(EtcdRendezvousOptions options);
  ~EtcdRendezvous() override;

  const std::string& run_id() const override { return options_.run_id; }

 protected:
  RendezvousInfo do_next_rendezvous(int local_world_size) override;
  RoundStop do_stop_round(const RoundStop& stop) override;
  std::optional<RoundStop> do_wait_round_stopped(std::chrono::milliseconds timeout) override;
  void do_node_done() override;
  void do_set_closed() override;
  bool do_is_closed() override;
  void do_shutdown() override;
  RendezvousStoreError store_failure(const StoreError& e) const override;

 private:
  struct State;  // active_version, read
  using Clock = std::chrono::steady_clock;

  std::string path(const std::string& p) const;  // "<prefix>run_<id><p>"
  State read_state(Client& client) const;
  void create_dir(const std::string& full_path, std::optional<int64_t> ttl);
  // torch's phases; each returns the (version, rank, nodes) of a completed round or throws one of the retry
  // signals (etcd_rendezvous.cc).
  struct Joined {
    std::string version;
    int rank = 0;
    int nodes = 0;
  };
  Joined barrier();
  Joined init_phase();
  Joined join_phase(const std::string& version);
  Joined confirm_phase(const std::string& version, int rank);
  void handle_existing(const std::string& version);
  Response try_create();
  std::pair<Response, int> join(const std::string& version);
  Response wait_for_peers(const std::string& version);
  void confirm_membership(const std::string& version, int rank);
  Response wait_for_final(const std::string& version);
  void announce_waiting(const std::string& version);
  void wait_to_free(const std::string& version);
  void last_call(const std::string& version, Clock::time_point deadline);

  // What a phase writes to active_version: the new value and its TTL in seconds (none: the key does not
  // expire).
  struct Change {
    std::string value;
    std::optional<int64_t> ttl;
  };
  // Given the state as read: the Change to write, nullopt for nothing to write, or a retry signal thrown.
  using ChangeFn = std::function<std::optional<Change>(const State&)>;
  // What a read that finds no active_version (etcd error 100) means to update_state.
  enum class IfGone { kThrow, kNothingToChange };
  // torch's read-change-compare-and-swap, the one loop of every phase that writes the state: reads
  // active_version, asks `change`, and writes the Change with prevValue = the value read; a lost race (etcd
  // error 101) pauses retry_backoff() and starts again from a fresh read. Returns the write's response;
  // nullopt when `change` wrote nothing, or when the state is gone and `if_gone` says kNothingToChange.
  // Throws what read_state, `change` and the write throw (but 101).
  std::optional<Response> update_state(const ChangeFn& change, IfGone if_gone = IfGone::kThrow);
  // Watches `key` (`recursive`: its subtree) from `index` for at most `timeout` and the join timeout left
  // plus 1 s; a change, nothing, or an index older than etcd's history all end it. False once the join
  // timeout has passed.
  bool watch_in_time(const std::string& key, bool recursive, uint64_t index,
                     std::optional<std::chrono::milliseconds> timeout);
  // A watch of active_version from `index`, then the state read again; RendezvousTimeoutError once the join
  // timeout has passed.
  State wait_for_change(uint64_t index);
  RendezvousTimeoutError join_timed_out() const;
  // The round's store and what torch's agents exchange in it (etcd_round.cc).
  RendezvousInfo share_round(const Joined& joined, int local_world_size);
  std::optional<RoundStop> evaluate_round(uint64_t& index);
  RendezvousStoreError foreign(const std::string& key, const std::string& value,
                               const std::string& why) const;

  EtcdRendezvousOptions options_;
  std::shared_ptr<Client> client_;          // the agent loop's
  std::shared_ptr<Client> watcher_client_;  // the watcher thread's
  std::unique_ptr<LeaseKeeper> leases_;
  Clock::time_point deadline_{};
  std::string keep_alive_key_;  // this node's in the current round ("" before one)
  // The current round; written by next_rendezvous before the watcher starts.
  std::string version_;
  int rank_ = -1;
  int nodes_ = 0;
  std::unique_ptr<EtcdStore> kv_;                       // the agent loop's view of the round's store
  std::unique_ptr<EtcdStore> watcher_kv_;               // the watcher's
  uint64_t watch_index_ = 0;                            // watcher thread only
  std::optional<Clock::time_point> unreachable_since_;  // watcher thread only: no etcd member answered since
};

}  // namespace ddprun::rdzv::etcd
