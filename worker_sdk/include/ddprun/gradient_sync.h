// GradientSynchronizer: data-parallel gradient averaging for a libtorch module, the C++ counterpart of
// torch.nn.parallel.DistributedDataParallel's reducer.
//
//   auto ctx = ddprun::sdk::init();
//   ddprun::sdk::GradientSynchronizer sync(*model, ctx->process_group());   // broadcasts rank 0's weights
//   for (...) {
//     optimizer.zero_grad();
//     loss_fn(model->forward(x), y).backward();   // gradients are averaged over all ranks when this returns
//     optimizer.step();
//   }
//
// How: the trainable parameters are grouped into buckets (first bucket `first_bucket_cap_bytes`, the
// others `bucket_cap_bytes`, in reverse registration order — roughly the order backward produces them —
// and never mixing dtypes or devices). A post-hook on each parameter's gradient accumulator copies the
// fresh gradient into its bucket; when a bucket is complete, a communication thread all-reduces it (kAvg)
// while backward keeps computing the earlier layers. Buckets are launched strictly in bucket order on every
// rank. At the end of backward (a callback queued on the autograd engine — nothing to call) the thread
// waits for the remaining buckets and writes the averaged gradients back into each parameter's .grad().
// finish() does the same explicitly and is a no-op when backward already did it.
//
// Parameters without a gradient in a backward (unused in forward) contribute their current .grad(), or
// zeros when it is undefined, and receive the average like the others. With find_unused_parameters (as in
// DDP) one more small all-reduce per backward finds the parameters no rank used: their .grad() is left as
// it was (undefined stays undefined, so optimizers skip them). Without it such a parameter gets a zero
// gradient, which momentum or weight decay still act on.
// no_sync(): while the returned guard lives, backward only accumulates local gradients (gradient
// accumulation); the next backward outside the guard averages the accumulated gradients.
//
// Construction is collective (every rank constructs with the same model): it checks that every rank has the
// same parameter shapes and dtypes (std::runtime_error naming the first rank that differs) and, unless
// disabled, broadcasts rank 0's parameters and buffers. Tensors must be on the process group's device kind
// (CPU for "cpu", CUDA for "nccl"; the bucket lives on the parameters' device). Supported parameter dtypes:
// float32, float64, float16, bfloat16.
//
// Errors: a failed or timed-out all-reduce (e.g. a dead peer) is thrown from backward() (or finish()) as
// CollectiveError naming the bucket, the operation and the peer; the synchroniser is then broken and every
// later backward throws at once — the job should exit and let the agent restart it. A backward that fails
// for another reason in the middle of a synchronised step also breaks it (the ranks' collective sequences
// would diverge).
//
// CUDA: each gradient copy into a bucket is followed by an event on the current stream; the communication
// thread waits for the events of a bucket before the all-reduce, so NCCL (on its own stream) never reads
// a bucket before the copies are done, whatever streams the program uses.
// Threads: the process group is used by the communication thread from the first gradient of a backward to
// the end of that backward; the program may use the group itself outside that window (e.g. between steps).
// Lifetime: the module's parameters and the process group must outlive the synchroniser; the destructor
// stops the thread and detaches the hooks (a later backward no longer synchronises). Do not destroy it
// while a backward is running.
// Not supported: sparse gradients (the backward that produces one fails with std::invalid_argument and the
// synchroniser is broken).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "ddprun/process_group.h"

namespace torch::nn {
class Module;
}

namespace ddprun::sdk {

struct GradientSyncOptions {
  size_t bucket_cap_bytes = size_t{25} << 20;  // DDP's bucket_cap_mb = 25
  size_t first_bucket_cap_bytes = size_t{1}
                                  << 20;  // DDP's first bucket: small, so communication starts early
  bool broadcast_parameters = true;       // at construction: rank 0's parameters and buffers
  // One extra all-reduce of a byte per parameter per backward, so parameters no rank used keep their
  // .grad() untouched (DDP's find_unused_parameters=True). Off: they get zeros (see above).
  bool find_unused_parameters = false;
};

// Per-backward numbers, for logs and benchmarks.
struct GradientSyncStats {
  size_t buckets = 0;
  size_t bytes = 0;                           // gradient bytes all-reduced
  std::chrono::nanoseconds communication{0};  // summed time inside all_reduce calls
  std::chrono::nanoseconds exposed_wait{0};   // end of backward spent waiting for communication (not hidden)
  // When the step's first bucket began its all-reduce: the end of this rank's own work before communication
  // (the straggler report measures from the previous step's end to here).
  std::chrono::steady_clock::time_point first_collective{};
};

class GradientSynchronizer {
 public:
  // Parameters with requires_grad of `module` (recursively, each once).
  GradientSynchronizer(torch::nn::Module& module, ProcessGroup& pg, GradientSyncOptions options = {});
  // An explicit parameter list (requires_grad leaves) and buffers to broadcast at construction.
  GradientSynchronizer(std::vector<at::Tensor> parameters, std::vector<at::Tensor> buffers, ProcessGroup& pg,
                       GradientSyncOptions options = {});
  ~GradientSynchronizer();
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  // RAII: backward passes inside the guard's lifetime skip synchronisation (gradient accumulation).
  class NoSyncGuard {
   public:
    NoSyncGuard(NoSyncGuard&& other) noexcept;
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;
    ~NoSyncGuard();

   private:
    friend class GradientSynchronizer;
    explicit NoSyncGuard(GradientSynchronizer* owner);
    GradientSynchronizer* owner_;
  };
  [[nodiscard]] NoSyncGuard no_sync();

  // Waits for the current backward's buckets and writes the averaged gradients back. Backward does this
  // itself; call it only after running backward in a way that skips engine callbacks. No-op when idle.
  void finish();

  // Collective: copies `root`'s parameters (buffers) to every rank.
  void broadcast_parameters(int root = 0);
  void broadcast_buffers(int root = 0);

  size_t num_parameters() const;
  // The parameter indices (positions in the parameter list) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_assignment() const;
  GradientSyncStats last_stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::optional<std::chrono::steady_clock::time_point> last_finish_;  // for the step time of heartbeat()
};

}  // namespace ddprun::sdk
