// GradientSynchronizer (see ddprun/gradient_sync.h): buckets, accumulator post-hooks, one communication
// thread, and the end-of-backward callback that writes the averaged gradients back.
//
// Lock discipline: State::mu guards the per-backward bookkeeping (marked, pending, ready, next_launch,
// completed, active, error, stats). Gradient copies into a bucket happen outside the lock: each parameter
// owns a disjoint slice, and the communication thread reads a bucket only after it is marked ready.
#include "ddprun/gradient_sync.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "ddprun/progress.h"
#include "ddprun/tensor_ops.h"
#include "parameter_sets.h"

namespace ddprun::sdk {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

bool floating(c10::ScalarType t) {
  return t == c10::kFloat || t == c10::kDouble || t == c10::kHalf || t == c10::kBFloat16;
}

struct Bucket {
  std::vector<size_t> params;    // parameter indices
  std::vector<int64_t> offsets;  // element offset of each parameter in `flat`
  at::Tensor flat;
  DType dtype = DType::kFloat32;
  size_t bytes = 0;
  size_t pending = 0;  // parameters still without a gradient this backward (State::mu)
  bool ready = false;  // every gradient copied in; the communication thread may launch it (State::mu)
};

}  // namespace

struct GradientSynchronizer::State : std::enable_shared_from_this<State> {
  State(ProcessGroup& group, GradientSyncOptions opts) : pg(group), options(opts) {}

  ProcessGroup& pg;
  const GradientSyncOptions options;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> buffers;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of, slot_of;  // parameter -> (bucket, position in the bucket)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  // CUDA parameters: an event recorded after the gradient's copy into its bucket (nullptr for CPU).
  std::vector<std::unique_ptr<c10::Event>> copied;
  std::vector<uintptr_t> hook_keys;
  std::atomic<int> no_sync_depth{0};
  std::atomic<bool> detached{false};

  std::mutex mu;
  std::condition_variable cv;
  bool active = false;       // a synchronised backward is under way (its callback is queued)
  std::vector<char> marked;  // parameter's gradient is in its bucket this backward
  size_t next_launch = 0;    // next bucket the communication thread launches
  size_t completed = 0;      // buckets whose all-reduce returned
  bool stop = false;
  std::exception_ptr error;  // sticky: the synchroniser is broken
  GradientSyncStats current, last;
  std::thread comm;

  // Post-hook of a gradient accumulator.
  class ReadyHook final : public torch::autograd::FunctionPostHook {
   public:
    ReadyHook(std::weak_ptr<State> state, size_t index) : state_(std::move(state)), index_(index) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list& /*inputs*/) override {
      if (auto s = state_.lock()) s->on_gradient_ready(index_);
      return outputs;
    }

   private:
    std::weak_ptr<State> state_;
    size_t index_;
  };

  at::Tensor slice(size_t p) const {
    const Bucket& b = buckets[bucket_of[p]];
    return b.flat.narrow(0, b.offsets[slot_of[p]], params[p].numel()).view(params[p].sizes());
  }

  // Copies parameter p's gradient (zeros when undefined) into its bucket slice and counts it in.
  void contribute(size_t p) {
    try {
      at::NoGradGuard no_grad;
      const at::Tensor& g = params[p].grad();
      if (g.defined() && g.layout() != c10::kStrided) {
        throw std::invalid_argument("parameter " + std::to_string(p) +
                                    " got a sparse gradient; GradientSynchronizer supports dense gradients "
                                    "only (e.g. use torch::nn::Embedding without sparse=true)");
      }
      if (g.defined()) {
        slice(p).copy_(g);
      } else {
        slice(p).zero_();
      }
      if (copied[p]) {
        const c10::Device device = params[p].device();
        copied[p]->record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
      }
    } catch (const std::exception& e) {
      std::lock_guard lk(mu);
      if (!error) {
        error = std::make_exception_ptr(std::invalid_argument(std::string("GradientSynchronizer: ") +
                                                              e.what() + " (synchroniser broken)"));
      }
      cv.notify_all();
      std::rethrow_exception(error);
    }
    std::lock_guard lk(mu);
    Bucket& b = buckets[bucket_of[p]];
    if (--b.pending == 0) {
      b.ready = true;
      cv.notify_all();
    }
  }

  // Post-hook of parameter p's gradient accumulator: the gradient is final for this backward.
  void on_gradient_ready(size_t p) {
    if (detached.load() || no_sync_depth.load() > 0) return;
    {
      std::lock_guard lk(mu);
      if (error) std::rethrow_exception(error);
      if (!active) {
        active = true;
        current = {};
        std::weak_ptr<State> weak = weak_from_this();
        torch::autograd::Engine::get_default_engine().queue_callback([weak] {
          if (auto s = weak.lock()) s->finish();
        });
      }
      if (marked[p]) {
        error = std::make_exception_ptr(std::logic_error(
            "GradientSynchronizer: parameter " + std::to_string(p) +
            " got a second gradient in one synchronised backward: an earlier backward failed before its "
            "gradients were averaged, so the ranks' collectives no longer match; restart the job"));
        std::rethrow_exception(error);
      }
      marked[p] = 1;
    }
    contribute(p);
  }

  void comm_loop() {
    std::unique_lock lk(mu);
    for (;;) {
      cv.wait(lk,
              [&] { return stop || (!error && next_launch < buckets.size() && buckets[next_launch].ready); });
      if (stop) return;
      const size_t b = next_launch++;
      Bucket& bucket = buckets[b];
      const auto t0 = SteadyClock::now();
      if (b == 0) current.first_collective = t0;
      lk.unlock();
      std::exception_ptr failure;
      try {
        wait_for_copies(bucket);
        pg.all_reduce(bucket.flat.data_ptr(), static_cast<size_t>(bucket.flat.numel()), bucket.dtype,
                      ReduceOp::kAvg);
      } catch (const CollectiveError& e) {
        failure = std::make_exception_ptr(CollectiveError(describe_bucket(b) + ": " + e.what(), e.peer()));
      } catch (const std::exception& e) {
        failure = std::make_exception_ptr(CollectiveError(describe_bucket(b) + ": " + e.what(), -1));
      }
      const auto dt = SteadyClock::now() - t0;
      lk.lock();
      current.communication += std::chrono::duration_cast<std::chrono::nanoseconds>(dt);
      current.bytes += bucket.bytes;
      ++current.buckets;
      ++completed;
      if (failure && !error) error = failure;
      cv.notify_all();
    }
  }

  // CUDA buckets: the gradient copies ran on the autograd streams; NCCL runs on its own stream.
  void wait_for_copies(const Bucket& bucket) const {
    for (size_t p : bucket.params) {
      if (!copied[p]) continue;
      for (int spins = 0; !copied[p]->query(); ++spins) {
        if (spins < 64) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
  }

  std::string describe_bucket(size_t b) const {
    const Bucket& bucket = buckets[b];
    return "gradient sync on rank " + std::to_string(pg.rank()) + ": all_reduce of bucket " +
           std::to_string(b) + "/" + std::to_string(buckets.size()) + " (" + mib(bucket.bytes) + " " +
           dtype_name(bucket.dtype) + ", " + std::to_string(bucket.params.size()) + " parameters) failed";
  }

  // find_unused_parameters: a byte per parameter, 1 when this rank produced a gradient for it in this
  // backward or holds an accumulated one; the maximum over the ranks says whether any rank used it. Runs
  // after every bucket completed (the group is free again); a failure breaks the synchroniser like a
  // bucket's.
  std::vector<char> find_used(const std::vector<size_t>& missing) {
    at::Tensor used = at::ones({static_cast<int64_t>(params.size())}, at::TensorOptions().dtype(at::kByte));
    uint8_t* flags = used.data_ptr<uint8_t>();
    for (size_t p : missing) {
      if (!params[p].grad().defined()) flags[p] = 0;
    }
    used = used.to(params.front().device());
    try {
      all_reduce(pg, used, ReduceOp::kMax);
    } catch (const std::exception& e) {
      const auto* ce = dynamic_cast<const CollectiveError*>(&e);
      std::lock_guard lk(mu);
      if (!error) {
        error = std::make_exception_ptr(
            CollectiveError("gradient sync on rank " + std::to_string(pg.rank()) +
                                ": all_reduce of the used-parameter map failed: " + e.what(),
                            ce ? ce->peer() : -1));
      }
      active = false;
      std::rethrow_exception(error);
    }
    used = used.cpu();
    const uint8_t* any = used.data_ptr<uint8_t>();
    return std::vector<char>(any, any + params.size());
  }

  // End of a synchronised backward: unused parameters count in, wait for every bucket, write back.
  void finish() {
    std::vector<size_t> missing;
    {
      std::lock_guard lk(mu);
      if (!active) {
        if (error) std::rethrow_exception(error);
        return;
      }
      for (size_t p = 0; p < params.size(); ++p) {
        if (!marked[p]) {
          marked[p] = 1;
          missing.push_back(p);
        }
      }
    }
    for (size_t p : missing) contribute(p);

    std::unique_lock lk(mu);
    const auto t0 = SteadyClock::now();
    // The process group's timeout bounds every all-reduce, so this wait ends.
    cv.wait(lk, [&] { return stop || (completed == next_launch && (error || completed == buckets.size())); });
    current.exposed_wait = std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - t0);
    if (stop && !error) {
      error = std::make_exception_ptr(
          std::logic_error("GradientSynchronizer: destroyed while a backward was being synchronised"));
    }
    if (error) {
      active = false;
      std::rethrow_exception(error);
    }
    lk.unlock();
    std::vector<char> used_anywhere;
    if (options.find_unused_parameters) used_anywhere = find_used(missing);
    {
      at::NoGradGuard no_grad;
      for (size_t p = 0; p < params.size(); ++p) {
        if (!used_anywhere.empty() && !used_anywhere[p]) continue;  // no rank used it: leave .grad() alone
        at::Tensor& g = params[p].mutable_grad();
        if (g.defined()) {
          g.copy_(slice(p));
        } else {
          g = slice(p).clone();
        }
      }
    }
    lk.lock();
    for (auto& bucket : buckets) {
      bucket.pending = bucket.params.size();
      bucket.ready = false;
    }
    std::fill(marked.begin(), marked.end(), 0);
    next_launch = completed = 0;
    active = false;
    last = current;
  }
};

GradientSynchronizer::GradientSynchronizer(torch::nn::Module& module, ProcessGroup& pg,
                                           GradientSyncOptions options)
    : GradientSynchronizer(module.parameters(/*recurse=*/true), module.buffers(/*recurse=*/true), pg,
                           options) {}

GradientSynchronizer::GradientSynchronizer(std::vector<at::Tensor> parameters,
                                           std::vector<at::Tensor> buffers, ProcessGroup& pg,
                                           GradientSyncOptions options)
    : state_(std::make_shared<State>(pg, options)) {
  State& s = *state_;
  s.params = unique_tensors(parameters, /*trainable_only=*/true);
  s.buffers = unique_tensors(buffers, /*trainable_only=*/false);
  if (s.params.empty()) throw std::invalid_argument("GradientSynchronizer: no parameter requires a gradient");
  if (options.bucket_cap_bytes == 0 || options.first_bucket_cap_bytes == 0) {
    throw std::invalid_argument("GradientSynchronizer: bucket caps must be positive");
  }
  for (size_t p = 0; p < s.params.size(); ++p) {
    const at::Tensor& t = s.params[p];
    if (!t.is_leaf())
      throw std::invalid_argument("GradientSynchronizer: parameter " + std::to_string(p) + " is not a leaf");
    if (!floating(t.scalar_type()) || t.layout() != c10::kStrided) {
      throw std::invalid_argument(
          "GradientSynchronizer: parameter " + std::to_string(p) + " has dtype " +
          c10::toString(t.scalar_type()) +
          "; only dense float32, float64, float16 and bfloat16 parameters are supported");
    }
    at::Tensor probe = at::empty({0}, t.options().requires_grad(false));
    check_tensor(pg, probe, "GradientSynchronizer");  // device kind matches the backend
  }

  // Buckets in DDP's layout and launch order (parameter_sets.h).
  const auto assignment = assign_buckets(s.params, options.first_bucket_cap_bytes, options.bucket_cap_bytes);
  s.bucket_of.resize(s.params.size());
  s.slot_of.resize(s.params.size());
  for (const auto& members : assignment) {
    Bucket b;
    b.params = members;
    int64_t numel = 0;
    for (size_t j = 0; j < members.size(); ++j) {
      s.bucket_of[members[j]] = s.buckets.size();
      s.slot_of[members[j]] = j;
      b.offsets.push_back(numel);
      numel += s.params[members[j]].numel();
    }
    const at::Tensor& first = s.params[members.front()];
    b.flat = at::empty({numel}, first.options().requires_grad(false));
    b.dtype = to_dtype(first.scalar_type());
    b.bytes = static_cast<size_t>(numel) * first.element_size();
    b.pending = members.size();
    s.buckets.push_back(std::move(b));
  }
  s.marked.assign(s.params.size(), 0);
  for (const auto& t : s.params) {
    s.copied.push_back(t.is_cuda() ? std::make_unique<c10::Event>(c10::DeviceType::CUDA) : nullptr);
  }

  verify_same_model(pg, s.params);
  if (options.broadcast_parameters) {
    broadcast_coalesced(pg, s.params, 0);
    if (!s.buffers.empty()) broadcast_coalesced(pg, s.buffers, 0);
  }

  // Hooks on the gradient accumulators; keep the accumulators alive so the hooks stay attached.
  for (size_t p = 0; p < s.params.size(); ++p) {
    auto acc = torch::autograd::impl::grad_accumulator(s.params[p]);
    if (!acc)
      throw std::invalid_argument("GradientSynchronizer: parameter " + std::to_string(p) +
                                  " has no gradient accumulator");
    s.hook_keys.push_back(acc->add_post_hook(std::make_unique<State::ReadyHook>(state_, p)));
    s.accumulators.push_back(std::move(acc));
  }
  s.comm = std::thread([state = state_.get()] { state->comm_loop(); });
}

GradientSynchronizer::~GradientSynchronizer() {
  State& s = *state_;
  s.detached.store(true);
  {
    std::lock_guard lk(s.mu);
    s.stop = true;
  }
  s.cv.notify_all();
  if (s.comm.joinable()) s.comm.join();
  for (size_t p = 0; p < s.accumulators.size(); ++p) s.accumulators[p]->del_post_hook(s.hook_keys[p]);
}

GradientSynchronizer::NoSyncGuard::NoSyncGuard(GradientSynchronizer* owner) : owner_(owner) {
  owner_->state_->no_sync_depth.fetch_add(1);
}
GradientSynchronizer::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept : owner_(other.owner_) {
  other.owner_ = nullptr;
}
GradientSynchronizer::NoSyncGuard::~NoSyncGuard() {
  if (owner_) owner_->state_->no_sync_depth.fetch_sub(1);
}

GradientSynchronizer::NoSyncGuard GradientSynchronizer::no_sync() {
  return NoSyncGuard(this);
}

void GradientSynchronizer::finish() {
  state_->finish();
  // A synchronised step ended: progress for ddprun's hang detection, this rank's step time and, for the
  // straggler report, the time from the previous step's end to this step's first collective (unknown for
  // the first step).
  const auto now = std::chrono::steady_clock::now();
  const auto first_collective = last_stats().first_collective;
  double step = -1, before_collective = -1;
  if (last_finish_) {
    step = std::chrono::duration<double>(now - *last_finish_).count();
    if (first_collective > *last_finish_) {
      before_collective = std::chrono::duration<double>(first_collective - *last_finish_).count();
    }
  }
  last_finish_ = now;
  heartbeat(step, before_collective);
}

void GradientSynchronizer::broadcast_parameters(int root) {
  broadcast_coalesced(state_->pg, state_->params, root);
}

void GradientSynchronizer::broadcast_buffers(int root) {
  if (!state_->buffers.empty()) broadcast_coalesced(state_->pg, state_->buffers, root);
}

size_t GradientSynchronizer::num_parameters() const {
  return state_->params.size();
}

std::vector<std::vector<size_t>> GradientSynchronizer::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : state_->buckets) out.push_back(b.params);
  return out;
}

GradientSyncStats GradientSynchronizer::last_stats() const {
  std::lock_guard lk(state_->mu);
  return state_->last;
}

}  // namespace ddprun::sdk
