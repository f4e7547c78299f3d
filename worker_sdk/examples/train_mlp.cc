// ddprun-example-train: data-parallel training of an MLP with libtorch and the ddprun worker SDK.
//
//   ddprun --standalone --nproc_per_node 4 --no_python ddprun-example-train --steps 200 --checkpoint
//   /tmp/ck.pt ddprun-example-train --steps 50          # a plain single process works too (world size 1)
//
// Synthetic regression data is generated in-process from --seed (identical on every rank); each rank
// trains on its DistributedSampler shard, GradientSynchronizer averages the gradients during backward.
// Rank 0 logs loss and samples/s and writes --checkpoint every --checkpoint-every steps (atomically: temp
// file + rename). At start, when the checkpoint exists (a restart, TORCHELASTIC_RESTART_COUNT > 0, or a
// rerun) every rank resumes from it. At the end the ranks all-gather a checksum of their parameters and
// exit 3 unless all are identical. --crash-at-step makes --crash-rank exit 13 at that step in the first
// attempt only (restart tests). Rank 0's last line is a machine-readable "summary:" for benchmarks.
// --state-every N (under ddprun --state_memory): every N steps each rank saves the model's parameters and
// buffers and the optimizer's state (SGD's momentum buffers) with ddprun::sdk::state, asynchronously
// (ddprun/torch_state.h); at start every rank calls load() and, when the ranks agree on a version of step S,
// resumes at step S+1 (printing "rank R: resumed from ddprun::sdk::state at step S+1"), bit for bit where the
// saving run was; without one, the --checkpoint path applies. --crash-in-save-step S kills --crash-rank in
// the middle of its save of step S (its file size limit lowered: SIGXFSZ), first attempt only. Rank 0's
// "done:" line ends with params_fnv1a, a hash of every parameter's bytes (equal hashes: bitwise equal
// parameters). --step-sleep-ms sleeps after every step (tests that act on a job mid-run). The parts of
// libtorch this program uses, not <torch/torch.h> (data loaders, JIT, every nn module): a quarter less
// compile time.
#include <sys/resource.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/context.h"
#include "ddprun/distributed_sampler.h"
#include "ddprun/gradient_sync.h"
#include "ddprun/tensor_ops.h"
#include "ddprun/torch_state.h"

namespace sdk = ddprun::sdk;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  int64_t steps = 200;
  int64_t batch_size = 64;  // per rank
  int64_t dataset_size = 1 << 16;
  int64_t input_dim = 32;
  int64_t hidden = 256;
  int layers = 3;
  double lr = 0.02;
  double momentum = 0.9;
  uint64_t seed = 1234;
  std::string checkpoint;
  int64_t checkpoint_every = 50;
  int64_t log_every = 50;
  int64_t crash_at_step = -1;
  int crash_rank = 1;
  int64_t state_every = 0;  // 0: no ddprun::sdk::state
  int64_t crash_in_save_step = -1;
  int accumulation = 1;  // micro-batches per optimizer step (all but the last under no_sync)
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  std::string backend = "auto";
  std::string device = "cpu";
  int threads = 0;
  int64_t warmup = 5;     // steps left out of the summary's timing
  int step_sleep_ms = 0;  // after every step (tests that act mid-run)
};

torch::nn::Sequential make_model(const Flags& f) {
  torch::nn::Sequential net;
  int64_t in = f.input_dim;
  for (int i = 0; i + 1 < f.layers; ++i) {
    net->push_back(torch::nn::Linear(in, f.hidden));
    net->push_back(torch::nn::ReLU());
    in = f.hidden;
  }
  net->push_back(torch::nn::Linear(in, 1));
  return net;
}

void save_checkpoint(const std::string& path, torch::nn::Sequential& model, torch::optim::SGD& opt,
                     int64_t step) {
  torch::serialize::OutputArchive archive, opt_archive;
  model->save(archive);
  opt.save(opt_archive);
  archive.write("optimizer", opt_archive);
  archive.write("step", torch::tensor(step));
  const std::string tmp = path + ".tmp";
  archive.save_to(tmp);
  std::filesystem::rename(tmp, path);
}

// Tensors are loaded onto `device` (rank 0 saved them from its own device, e.g. cuda:0).
int64_t load_checkpoint(const std::string& path, torch::nn::Sequential& model, torch::optim::SGD& opt,
                        const torch::Device& device) {
  torch::serialize::InputArchive archive, opt_archive;
  archive.load_from(path, device);
  model->load(archive);
  archive.read("optimizer", opt_archive);
  opt.load(opt_archive);
  torch::Tensor step;
  archive.read("step", step);
  return step.item<int64_t>();
}

// Two sums over every parameter (plain and position-weighted) in float64: equal bits on every rank or not.
torch::Tensor checksum(torch::nn::Sequential& model) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat;
  for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape(-1).to(torch::kDouble));
  torch::Tensor all = torch::cat(flat);
  torch::Tensor w = torch::arange(1, all.numel() + 1, all.options()) / static_cast<double>(all.numel());
  return torch::stack({all.sum(), (all * w).sum()});
}

// FNV-1a over the bytes of every parameter, in order: equal on two runs only when the parameters are bitwise
// equal (the checksum above is a sum, which could hide a difference).
uint64_t params_fnv1a(torch::nn::Sequential& model) {
  uint64_t h = 14695981039346656037ull;
  for (const auto& p : model->parameters()) {
    const torch::Tensor c = p.detach().cpu().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

// Saves the model and the optimizer as this rank's version of `step` (the index of the step just done),
// asynchronously. With `die_midway`, the save is the last thing this process does: a file size limit below
// the version's size kills it (SIGXFSZ) in the middle of writing it.
void save_state(int64_t step, torch::nn::Sequential& model, torch::optim::SGD& opt, bool die_midway) {
  namespace state = ddprun::sdk::state;
  state::NamedTensors tensors;
  state::add_module(tensors, *model);
  state::add_optimizer(tensors, opt);
  if (die_midway) {
    std::fprintf(stderr, "dying in the middle of a ddprun::sdk::state save of step %lld\n",
                 static_cast<long long>(step));
    std::fflush(stderr);
    const rlimit no_core{0, 0}, small{4096, 4096};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::setrlimit(RLIMIT_FSIZE, &small);
    state::save(step, tensors, /*async=*/false);
    std::_Exit(12);  // not reached: the save is killed first
  }
  state::save(step, tensors, /*async=*/true);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const Flags& f) {
  if (f.threads > 0) torch::set_num_threads(f.threads);
  sdk::InitOptions init;
  // auto: the backend that fits --device (Backend::kAuto would pick NCCL for CPU tensors on a GPU machine).
  init.backend = f.backend == "nccl" || (f.backend == "auto" && f.device == "cuda") ? sdk::Backend::kNccl
                                                                                    : sdk::Backend::kCpu;
  auto ctx = sdk::init(init);
  sdk::ProcessGroup& pg = ctx->process_group();
  const int rank = ctx->rank(), world = ctx->world_size();
  const torch::Device device =
      f.device == "cuda" ? torch::Device(torch::kCUDA, ctx->local_rank()) : torch::kCPU;

  // The dataset: y = tanh(x W) v + noise, identical on every rank (same generator seed).
  torch::Tensor x, y;
  {
    auto gen = at::detail::createCPUGenerator(f.seed);
    x = at::randn({f.dataset_size, f.input_dim}, gen);
    torch::Tensor w = at::randn({f.input_dim, 16}, gen) / std::sqrt(static_cast<double>(f.input_dim));
    torch::Tensor v = at::randn({16, 1}, gen);
    y = torch::tanh(x.matmul(w)).matmul(v) + 0.01 * at::randn({f.dataset_size, 1}, gen);
    x = x.to(device);
    y = y.to(device);
  }

  torch::manual_seed(f.seed);
  auto model = make_model(f);
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(f.lr).momentum(f.momentum));

  int64_t step = 0;
  bool resumed = false;
  if (f.state_every > 0) {
    namespace state = ddprun::sdk::state;
    if (auto got = state::load_tensors(*ctx, std::chrono::minutes(5), device)) {
      state::restore_module(*model, got->tensors);
      state::restore_optimizer(opt, got->tensors, "optimizer", device);
      step = got->step + 1;
      resumed = true;
      std::printf("rank %d: resumed from ddprun::sdk::state at step %lld (restart %d)\n", rank,
                  static_cast<long long>(step), ctx->restart_count());
    } else if (ctx->is_main()) {
      std::printf("ddprun::sdk::state: nothing to resume from (%s)\n", state::why_none().c_str());
    }
    std::fflush(stdout);
  }
  const bool have_ckpt = !resumed && !f.checkpoint.empty() && std::filesystem::exists(f.checkpoint);
  // Every rank must agree on whether to resume (a checkpoint on a non-shared disk would split the job).
  torch::Tensor seen = torch::tensor({have_ckpt ? 1L : 0L}).to(device);
  torch::Tensor all_seen = sdk::all_gather(pg, seen).cpu();
  if (all_seen.min().item<int64_t>() != all_seen.max().item<int64_t>()) {
    std::fprintf(stderr,
                 "rank %d: the checkpoint %s is visible on some ranks only: use a shared filesystem\n", rank,
                 f.checkpoint.c_str());
    return 2;
  }
  if (have_ckpt) {
    step = load_checkpoint(f.checkpoint, model, opt, device);
    if (ctx->is_main()) {
      std::printf("resumed from %s at step %lld (restart %d)\n", f.checkpoint.c_str(),
                  static_cast<long long>(step), ctx->restart_count());
    }
  }

  sdk::GradientSyncOptions so;
  so.bucket_cap_bytes = static_cast<size_t>(f.bucket_cap_mb * (1 << 20));
  so.first_bucket_cap_bytes = static_cast<size_t>(f.first_bucket_mb * (1 << 20));
  sdk::GradientSynchronizer sync(*model, pg, so);  // also broadcasts rank 0's parameters
  sdk::DistributedSampler sampler(f.dataset_size, world, rank, {.shuffle = true, .seed = f.seed});
  const int64_t per_step = f.batch_size * f.accumulation;
  const int64_t steps_per_epoch = sampler.num_samples() / per_step;
  if (steps_per_epoch < 1) {
    std::fprintf(stderr, "rank %d: --dataset-size %lld too small for %d ranks x %lld samples per step\n",
                 rank, static_cast<long long>(f.dataset_size), world, static_cast<long long>(per_step));
    return 2;
  }
  if (ctx->is_main()) {
    std::printf("training: %d ranks (%s), %zu parameters in %zu buckets, batch %lld/rank, %lld steps\n",
                world, pg.describe().c_str(), sync.num_parameters(), sync.bucket_assignment().size(),
                static_cast<long long>(f.batch_size), static_cast<long long>(f.steps));
    std::fflush(stdout);
  }

  std::vector<double> step_ms, exposed_ms, comm_ms;
  torch::Tensor loss = torch::zeros({1});
  auto window_start = Clock::now();
  int64_t window_steps = 0;
  while (step < f.steps) {
    const int64_t epoch = step / steps_per_epoch;
    sampler.set_epoch(epoch);
    const auto idx_all = sampler.indices();
    for (int64_t b = step % steps_per_epoch; b < steps_per_epoch && step < f.steps; ++b) {
      if (step == f.crash_at_step && rank == f.crash_rank && ctx->restart_count() == 0) {
        std::fprintf(stderr, "rank %d: crashing on purpose at step %lld\n", rank,
                     static_cast<long long>(step));
        std::fflush(stderr);
        std::_Exit(13);
      }
      const auto t0 = Clock::now();
      opt.zero_grad();
      for (int m = 0; m < f.accumulation; ++m) {
        const int64_t first = b * per_step + m * f.batch_size;
        torch::Tensor idx = torch::tensor(std::vector<int64_t>(idx_all.begin() + first,
                                                               idx_all.begin() + first + f.batch_size))
                                .to(device);
        torch::Tensor out = model->forward(x.index_select(0, idx));
        loss = torch::mse_loss(out, y.index_select(0, idx)) / f.accumulation;
        if (m + 1 < f.accumulation) {
          auto guard = sync.no_sync();
          loss.backward();
        } else {
          loss.backward();  // gradients are averaged over the ranks when this returns
        }
      }
      opt.step();
      if (device.is_cuda()) torch::cuda::synchronize(device.index());  // a step ends when the GPU is done
      ++step;
      ++window_steps;
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (step > f.warmup) {
        step_ms.push_back(ms);
        const auto stats = sync.last_stats();
        exposed_ms.push_back(std::chrono::duration<double, std::milli>(stats.exposed_wait).count());
        comm_ms.push_back(std::chrono::duration<double, std::milli>(stats.communication).count());
      }
      if (f.step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f.step_sleep_ms));
      if (f.state_every > 0 && step % f.state_every == 0) {
        save_state(step - 1, model, opt,
                   step - 1 == f.crash_in_save_step && rank == f.crash_rank && ctx->restart_count() == 0);
      }
      if (ctx->is_main() && !f.checkpoint.empty() && f.checkpoint_every > 0 &&
          step % f.checkpoint_every == 0) {
        save_checkpoint(f.checkpoint, model, opt, step);
      }
      if (ctx->is_main() && f.log_every > 0 && (step % f.log_every == 0 || step == f.steps)) {
        const double s = std::chrono::duration<double>(Clock::now() - window_start).count();
        std::printf("step %lld/%lld loss %.5f (%.0f samples/s)\n", static_cast<long long>(step),
                    static_cast<long long>(f.steps), loss.item<double>() * f.accumulation,
                    static_cast<double>(window_steps * per_step * world) / s);
        std::fflush(stdout);
        window_start = Clock::now();
        window_steps = 0;
      }
    }
  }

  ddprun::sdk::state::wait();  // the last async save committed
  torch::Tensor sums = sdk::all_gather(pg, checksum(model).to(device)).cpu();
  bool identical = true;
  for (int r = 1; r < world; ++r) identical = identical && torch::equal(sums[r], sums[0]);
  if (!identical) {
    std::fprintf(stderr, "rank %d: parameters differ between ranks: %s\n", rank, torch::str(sums).c_str());
    return 3;
  }
  if (ctx->is_main()) {
    const double mean =
        step_ms.empty() ? 0 : std::accumulate(step_ms.begin(), step_ms.end(), 0.0) / step_ms.size();
    std::printf(
        "done: %d ranks, final loss %.5f, parameters identical (checksum %.17g) params_fnv1a=%016llx\n",
        world, loss.item<double>() * f.accumulation, sums[0][0].item<double>(),
        static_cast<unsigned long long>(params_fnv1a(model)));
    std::printf(
        "summary: ranks=%d steps=%zu step_ms_mean=%.3f step_ms_median=%.3f allreduce_ms_median=%.3f "
        "exposed_sync_ms_median=%.3f samples_per_s=%.0f\n",
        world, step_ms.size(), mean, median(step_ms), median(comm_ms), median(exposed_ms),
        mean > 0 ? static_cast<double>(per_step * world) * 1000.0 / mean : 0.0);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"ddprun example: data-parallel MLP training with libtorch and the ddprun worker SDK"};
  app.add_option("--steps", f.steps, "optimizer steps in total")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", f.batch_size, "samples per rank per micro-batch")
      ->check(CLI::PositiveNumber);
  app.add_option("--dataset-size", f.dataset_size, "synthetic samples")->check(CLI::PositiveNumber);
  app.add_option("--input-dim", f.input_dim)->check(CLI::PositiveNumber);
  app.add_option("--hidden", f.hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--layers", f.layers, "linear layers (>= 1)")->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr);
  app.add_option("--momentum", f.momentum);
  app.add_option("--seed", f.seed, "data, initial weights and shuffling");
  app.add_option("--checkpoint", f.checkpoint,
                 "checkpoint file: rank 0 writes it, every rank resumes from it");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints");
  app.add_option("--log-every", f.log_every, "steps between log lines (0: none)");
  app.add_option("--crash-at-step", f.crash_at_step,
                 "make --crash-rank exit 13 at this step (first attempt only)");
  app.add_option("--crash-rank", f.crash_rank);
  app.add_option("--state-every", f.state_every,
                 "save model + optimizer with ddprun::sdk::state every N steps (async); resume from it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--crash-in-save-step", f.crash_in_save_step,
                 "kill --crash-rank in the middle of its state save of this step (first attempt only)");
  app.add_option("--accumulation", f.accumulation, "micro-batches per step (no_sync on all but the last)")
      ->check(CLI::PositiveNumber);
  app.add_option("--bucket-cap-mb", f.bucket_cap_mb)->check(CLI::PositiveNumber);
  app.add_option("--first-bucket-mb", f.first_bucket_mb)->check(CLI::PositiveNumber);
  app.add_option("--backend", f.backend, "auto: nccl for --device cuda, else cpu")
      ->check(CLI::IsMember({"auto", "cpu", "nccl"}));
  app.add_option("--device", f.device)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", f.threads, "torch intra-op threads (0: torch's default)");
  app.add_option("--warmup", f.warmup, "steps left out of the summary's timing");
  app.add_option("--step-sleep-ms", f.step_sleep_ms, "sleep after every step (tests that act mid-run)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const sdk::CollectiveError& e) {
    std::fprintf(stderr, "ddprun-example-train: collective failed (peer %d): %s\n", e.peer(), e.what());
    return 4;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun-example-train: %s\n", e.what());
    return 1;
  }
}
