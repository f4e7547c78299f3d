// Operations on a model's list of parameter (or buffer) tensors that GradientSynchronizer needs besides
// its per-backward machinery: de-duplication, grouping by (dtype, device), the bucket layout, and the two
// collectives of its construction (a model fingerprint check and a coalesced broadcast).
//
// Collectives (verify_same_model, broadcast_coalesced) must be called by every rank of `pg` with the same
// tensor list shapes; they block and throw like the tensor collectives of ddprun/tensor_ops.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <vector>

#include "ddprun/process_group.h"

namespace ddprun::sdk {

// "dtype@device" of a tensor: tensors of one kind may share a flat buffer.
std::string tensor_kind(const at::Tensor& t);

// The defined tensors of `ts` (with requires_grad only, when trainable_only), each once, in order.
std::vector<at::Tensor> unique_tensors(const std::vector<at::Tensor>& ts, bool trainable_only);

// DDP's bucket layout: walking the tensors from the last to the first, per kind, a bucket is closed as soon
// as it holds first_cap bytes (the kind's first bucket) or cap bytes (the others); the rest of each kind
// forms a last bucket. Returns the tensor indices of each bucket, buckets ordered by the highest index they
// hold (the order backward reaches them), indices within a bucket descending.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<at::Tensor>& ts, size_t first_cap,
                                                size_t cap);

// Throws std::runtime_error naming the first rank whose tensors (count, dtypes, shapes) differ from this
// rank's; `params` must not be empty.
void verify_same_model(ProcessGroup& pg, const std::vector<at::Tensor>& params);

// Copies `root`'s tensors into every rank's, one flat broadcast per kind.
void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& ts, int root);

}  // namespace ddprun::sdk
