#include <torch/torch.h>

#include <cstdio>

#include "ddprun/context.h"
#include "ddprun/distributed_sampler.h"
#include "ddprun/gradient_sync.h"

int main() {
  ddprun::sdk::InitOptions init;
  init.backend = ddprun::sdk::Backend::kCpu;  // CPU tensors; kAuto picks NCCL when a GPU is visible
  auto ctx = ddprun::sdk::init(init);         // reads RANK, WORLD_SIZE, ...; a plain process: world size 1
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(32, 256), torch::nn::ReLU(), torch::nn::Linear(256, 1));
  torch::optim::SGD opt(model->parameters(), 0.01);
  ddprun::sdk::GradientSynchronizer sync(*model, ctx->process_group());  // broadcasts rank 0's weights

  auto x = torch::randn({4096, 32}), y = torch::randn({4096, 1});
  ddprun::sdk::DistributedSamplerOptions so;
  so.seed = 42;
  ddprun::sdk::DistributedSampler sampler(x.size(0), ctx->world_size(), ctx->rank(), so);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);
    auto idx = torch::tensor(sampler.indices());
    for (int64_t b = 0; b + 64 <= idx.size(0); b += 64) {
      auto batch = idx.slice(0, b, b + 64);
      opt.zero_grad();
      auto loss = torch::mse_loss(model->forward(x.index_select(0, batch)), y.index_select(0, batch));
      loss.backward();  // returns with the gradients averaged over all ranks
      opt.step();
    }
    if (ctx->is_main()) std::printf("epoch %lld done\n", static_cast<long long>(epoch));
  }
}
