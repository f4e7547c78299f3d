// StateServer: the agent's end of the copies of training state (agent/state/state_wire.h). It keeps, in the
// replica/ directory of its StateDirectory, the versions its buddy's agent puts (the two newest committed per
// rank, and the one arriving: a copy is committed, by rename, only when its CRC-32C matches the sender's and
// its manifest names the rank and step it was sent as), and serves the versions it holds of a rank (replica/
// first, else own/) to an agent that restores it.
//
// Listens on every interface (IPv6 and IPv4), or `bind_host` when it is an address, on a free port. With
// `auth` (the job's secret or MUNGE, as the store's), a client must prove it (docs/state.md, Security);
// without, any client is served, as the job's open store serves anyone.
//
// Threads: an accept thread and one thread per connection (at most kMaxConnections; more are closed at once);
// the destructor stops them all (their connections interrupted) and joins. counters() is thread-safe.
// Errors: the constructor throws std::system_error when it cannot listen; a failed exchange is logged (warn)
// and ends its connection only.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agent/state/state_connection.h"
#include "agent/state/state_directory.h"
#include "rendezvous/store/store_auth.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::agent {

class StateServer {
 public:
  static constexpr int kMaxConnections = 16;

  struct Counters {
    uint64_t copies_received = 0;  // committed in replica/
    uint64_t bytes_received = 0;
    uint64_t versions_served = 0;  // sent to a restoring agent
  };

  // `replica_bytes`: the most one copy may take (each rank's share of --state_memory for the buddy's copies).
  StateServer(const StateDirectory& dir, const std::string& bind_host,
              std::shared_ptr<const rdzv::StoreAuth> auth, uint64_t replica_bytes);
  ~StateServer();
  StateServer(const StateServer&) = delete;
  StateServer& operator=(const StateServer&) = delete;

  uint16_t port() const { return port_; }
  Counters counters() const;

 private:
  struct Peer {
    std::thread thread;
    std::shared_ptr<StateConnection> connection;
    std::atomic<bool> done{false};
  };

  void accept_loop();
  void serve(StateConnection& c);
  void put(StateConnection& c, const StateMessage& m);
  void get(StateConnection& c, const StateMessage& m);
  void reap_finished();  // requires mu_

  const StateDirectory& dir_;
  std::shared_ptr<const rdzv::StoreAuth> auth_;
  uint64_t replica_bytes_;
  UniqueFd listener_;
  UniqueFd stop_;  // eventfd: ends the accept thread
  uint16_t port_ = 0;
  std::atomic<uint64_t> serial_{0};
  std::atomic<uint64_t> copies_{0}, bytes_{0}, served_{0};
  std::mutex mu_;
  std::list<Peer> peers_;  // guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  std::thread acceptor_;
};

}  // namespace ddprun::agent
