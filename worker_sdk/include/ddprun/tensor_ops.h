// Collectives on torch::Tensor: thin adapters from libtorch tensors to ddprun::sdk::ProcessGroup.
//
//   ddprun::sdk::all_reduce(ctx->process_group(), loss_sum, ddprun::sdk::ReduceOp::kAvg);
//   ddprun::sdk::broadcast(ctx->process_group(), weights, /*root=*/0);
//
// Tensors must be defined, contiguous, of a dtype ProcessGroup knows (float32/64, float16, bfloat16, int32,
// int64, uint8) and on the backend's device (CPU tensors for the "cpu" backend, CUDA tensors on the group's
// device for "nccl"; the single-process group takes either). For a CUDA tensor the current stream of its
// device is synchronised first, so the kernels that produced it have finished before NCCL reads it. A tensor that is not is refused with std::invalid_argument naming
// the operation and the offending property, before any communication, so every rank fails alike only if
// every rank passes the same tensor. Collective failures are CollectiveError, as in process_group.h.
// Blocking, and subject to the group's timeout, like the ProcessGroup calls they wrap.
#pragma once

#include <ATen/core/Tensor.h>

#include "ddprun/process_group.h"

namespace ddprun::sdk {

// The DType of a torch scalar type; std::invalid_argument naming it when ProcessGroup has no such type.
DType to_dtype(c10::ScalarType type);

// Throws std::invalid_argument when `t` cannot be passed to `pg` (see above); `op` names the caller.
void check_tensor(const ProcessGroup& pg, const at::Tensor& t, const char* op);

// For a CUDA tensor: blocks until the current stream of its device has finished the queued work (a no-op
// for CPU tensors). The collectives below call it; call it before ProcessGroup calls on raw device memory.
void wait_for_producers(const at::Tensor& t);

// In place: every rank's `t` becomes the reduction over all ranks.
void all_reduce(ProcessGroup& pg, at::Tensor& t, ReduceOp op = ReduceOp::kSum);

// In place: `t` of rank `root` is copied to every rank (same shape and dtype everywhere).
void broadcast(ProcessGroup& pg, at::Tensor& t, int root);

// Returns a new tensor of shape [pg.size(), *t.shape]: row r is rank r's `t`.
at::Tensor all_gather(ProcessGroup& pg, const at::Tensor& t);

}  // namespace ddprun::sdk
