// DistributedSampler: torch's index arithmetic, line by line (torch/utils/data/distributed.py).
#include "ddprun/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randperm.h>

#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>

namespace ddprun::sdk {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);  // what Generator.manual_seed does
  }
  at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong)).contiguous();
  const int64_t* p = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + n);
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  if (num_replicas < 1) {
    throw std::invalid_argument("DistributedSampler: num_replicas " + std::to_string(num_replicas) + " < 1");
  }
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedSampler: invalid rank " + std::to_string(rank) +
                                ", rank should be in the interval [0, " + std::to_string(num_replicas - 1) +
                                "]");
  }
  if (dataset_size < 0) {
    throw std::invalid_argument("DistributedSampler: dataset size " + std::to_string(dataset_size) + " < 0");
  }
  if (options_.drop_last && dataset_size % num_replicas != 0) {
    // Python: math.ceil((len - replicas) / replicas); the quotient may be negative (n < replicas) -> floor
    // towards zero of a negative fraction, i.e. 0 when n < replicas.
    const int64_t num = dataset_size - num_replicas;
    num_samples_ = num <= 0 ? 0 : ceil_div(num, num_replicas);
  } else {
    num_samples_ = ceil_div(dataset_size, num_replicas);
  }
  total_size_ = num_samples_ * num_replicas;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (options_.shuffle) {
    all = torch_randperm(dataset_size_, options_.seed + static_cast<uint64_t>(epoch_));
  } else {
    all.resize(static_cast<size_t>(dataset_size_));
    std::iota(all.begin(), all.end(), int64_t{0});
  }
  if (!options_.drop_last) {
    // Pad by repeating the list from its start (several times when padding > n), as torch does.
    const size_t n = all.size();
    for (size_t i = 0; all.size() < static_cast<size_t>(total_size_) && n > 0; ++i) all.push_back(all[i % n]);
  } else {
    all.resize(static_cast<size_t>(total_size_));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total_size_; i += num_replicas_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace ddprun::sdk
