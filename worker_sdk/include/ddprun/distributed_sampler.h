// DistributedSampler: this rank's share of a dataset's indices, epoch by epoch — the same indices as
// torch.utils.data.distributed.DistributedSampler for the same arguments (verified against Python torch).
//
//   ddprun::sdk::DistributedSampler sampler(dataset_size, ctx->world_size(), ctx->rank(), {.seed = 42});
//   for (int64_t epoch = 0; ...; ++epoch) {
//     sampler.set_epoch(epoch);                       // new shuffle each epoch, identical on every rank
//     for (int64_t i : sampler.indices()) ...          // num_samples() indices, disjoint across ranks
//   }
//
// Rules (torch's): with drop_last and a size not divisible by the number of replicas, the tail is dropped
// so every rank gets num_samples = ceil((n - replicas) / replicas); otherwise num_samples = ceil(n /
// replicas) and the index list is padded by repeating it from the start. total_size = num_samples * replicas;
// rank r takes positions r, r + replicas, r + 2*replicas, ... With shuffle, the permutation is
// torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)), reproduced with libtorch's own
// randperm and CPU generator, so the indices are identical to Python's.
//
// Pure computation; thread-compatible (const methods may run concurrently). Errors: std::invalid_argument
// for num_replicas < 1 or a rank outside [0, num_replicas).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddprun::sdk {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;  // must be the same on every rank
  bool drop_last = false;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                     DistributedSamplerOptions options = {});

  // The shuffle of indices() depends on seed + epoch; call at the start of every epoch, like torch.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  int64_t num_samples() const { return num_samples_; }  // indices() per rank per epoch
  int64_t total_size() const { return total_size_; }    // num_samples() * num_replicas
  int64_t dataset_size() const { return dataset_size_; }

  // This rank's indices for the current epoch, in iteration order (num_samples() values in [0, n)).
  std::vector<int64_t> indices() const;

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t total_size_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace ddprun::sdk
