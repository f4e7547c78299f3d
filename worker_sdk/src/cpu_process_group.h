// CpuProcessGroup: the CPU backend of ProcessGroup (see ddprun/backends.h for what it promises).
//
// Bootstrap (constructor): every rank opens a TCP listener (0.0.0.0, port 0) and publishes
// "<prefix>/peer/<rank>" = pid, address, port, host id (topology.h); once all records are in, ranks with
// equal host ids form a host group. Per host with several ranks: a ShmCollectives segment (local rank 0
// creates it). Between hosts: a TcpRing among one leader per host (the host's lowest rank).
//
// Collectives, by topology:
//   one host             shared memory only
//   one rank per host    the TCP ring only
//   otherwise            hierarchical: reduce within the host (shm), all-reduce among the leaders (ring),
//                        broadcast within the host (shm); all_gather/broadcast/barrier likewise.
// The chosen arrangement is describe()'s text.
//
// Failures: any error inside a collective aborts the group (AbortSignal raised, shm segment poisoned, ring
// connections shut down), so the other ranks fail promptly too; the CollectiveError thrown names the op,
// the dtype and size, this rank, the elapsed time, and the peer blamed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "abort_signal.h"
#include "ddprun/process_group.h"
#include "shm_collectives.h"
#include "tcp_ring.h"
#include "tcp_socket.h"
#include "topology.h"

namespace ddprun::rdzv {
class Store;
}

namespace ddprun::sdk {

class CpuProcessGroup final : public ProcessGroup {
 public:
  // Blocks until every rank has joined (options.timeout); throws CollectiveError naming a missing rank.
  CpuProcessGroup(rdzv::Store& store, const std::string& prefix, int rank, int size,
                  const ProcessGroupOptions& options);
  ~CpuProcessGroup() override;

  const char* backend() const override { return "cpu"; }
  std::string describe() const override;
  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t count, DType dtype, int root) override;
  void all_gather(const void* in, void* out, size_t count, DType dtype) override;
  void barrier() override;
  void abort() override;

 private:
  void bootstrap(rdzv::Store& store, const std::string& prefix, const Deadline& deadline);
  // Runs body; on any failure aborts the group and throws CollectiveError with the op's context.
  template <class Body>
  void guarded(const std::string& what, const Deadline& deadline, Body&& body);
  void check_usable(const std::string& what) const;
  void break_transports(int blamed);

  ProcessGroupOptions options_;
  AbortSignal abort_;
  Topology topo_;
  bool multi_host_ = false;
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<ShmCollectives> shm_;
  std::unique_ptr<TcpRing> ring_;
};

}  // namespace ddprun::sdk
