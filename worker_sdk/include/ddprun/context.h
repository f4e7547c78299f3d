// The worker SDK's entry point: ddprun::sdk::init() reads the environment ddprun (or torchrun) sets and
// returns the job's Context — rank, sizes, the agent's store, and a process group.
//
//   auto ctx = ddprun::sdk::init();          // also works as a plain single process: world size 1
//   if (ctx->is_main()) log("...");
//   ctx->process_group().all_reduce(buf, n, DType::kFloat32, ReduceOp::kAvg);
//
// Environment read: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE (missing RANK/WORLD_SIZE = single process).
// The store at MASTER_ADDR:MASTER_PORT is, as for torch's env:// initialisation, the agent's TCPStore when
// TORCHELASTIC_USE_AGENT_STORE=True (ddprun; torchrun's static rendezvous; torchrun >= 2.4 with c10d),
// else one that rank 0 hosts there for the lifetime of its Context (torchrun 1.13 with c10d or
// --standalone); it is namespaced per attempt ("ddprun_sdk/attempt_<n>/"), so a restarted group never
// reads stale keys. The store is reached in the modern TCPStore dialect (ddprun's stores, torch >= 2.x),
// falling back to the legacy one (torchrun of torch 1.13/2.0). Also read, for the CPU backend:
// DDPRUN_CPU_TRANSPORT=auto|tcp (tcp: the TCP ring even between ranks of one host) and
// DDPRUN_SHM_SLOT_BYTES (shared-memory chunk size).
// Errors: std::runtime_error naming the variable or the endpoint (unreachable store within the timeout;
// rank 0 cannot listen on MASTER_PORT); CollectiveError when the process group cannot form (a rank missing
// at the timeout).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddprun/process_group.h"
#include "ddprun/rdzv/store.h"

namespace ddprun::sdk {

enum class Backend { kAuto, kCpu, kNccl };  // kAuto: NCCL when built with it and a GPU is visible, else CPU

struct InitOptions {
  Backend backend = Backend::kAuto;
  std::chrono::milliseconds timeout{300000};  // store connection and every collective
  // The NCCL backend's CUDA device: -1 = LOCAL_RANK (one GPU per local rank). Several ranks on one GPU
  // (tests, benchmarks on a one-GPU machine) name it and set a distinct NCCL_HOSTID each.
  int device = -1;
};

class Context {
 public:
  virtual ~Context() = default;
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_world_size() const { return local_world_size_; }
  int restart_count() const { return restart_count_; }
  bool is_main() const { return rank_ == 0; }
  virtual ProcessGroup& process_group() = 0;
  // The job's store (see above) under this attempt's prefix (nullptr when running as a single process).
  virtual rdzv::Store* store() = 0;
  void barrier() { process_group().barrier(); }

 protected:
  int rank_ = 0, world_size_ = 1, local_rank_ = 0, local_world_size_ = 1, restart_count_ = 0;
};

std::unique_ptr<Context> init(const InitOptions& options = {});

}  // namespace ddprun::sdk
