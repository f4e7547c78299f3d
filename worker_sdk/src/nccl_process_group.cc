// NcclProcessGroup: the NCCL backend of ProcessGroup (ddprun/backends.h: make_nccl_process_group).
//
// One communicator per process on CUDA device `device` (init() passes LOCAL_RANK). Bootstrap: rank 0 makes
// an ncclUniqueId and publishes it at "<prefix>/nccl_unique_id"; the others wait for it (options.timeout).
// The communicator is created non-blocking (ncclConfig_t::blocking = 0), so initialisation and every
// collective can be given up on: nothing ever blocks inside NCCL or CUDA without a deadline.
//
// Streams: collectives run on the group's own non-blocking stream, so they overlap with work the program
// queues on its streams meanwhile (e.g. the rest of backward while a gradient bucket is all-reduced). The
// caller must make sure the writes to a buffer are complete before passing it (synchronise the stream that
// produced it; ddprun/tensor_ops.h and the GradientSynchronizer do this). Every call is blocking: it returns
// once the collective has completed on the device, so the result may be used on any stream afterwards.
//
// Waiting: the calling thread polls the completion event, ncclCommGetAsyncError (peer loss, network
// errors), the abort flag and the deadline (CUDA offers no waitable handle with a timeout). On an error or a
// timeout the communicator is aborted with ncclCommAbort (never ncclCommDestroy, which can hang) and
// CollectiveError is thrown; the group is then broken and later calls throw at once. NCCL does not say
// which peer failed: peer() is -1 and the message says so.
//
// Threads: one collective at a time (op_mu_); abort() may be called from any thread: when a collective is
// in flight, that collective's thread performs the ncclCommAbort on its next poll (within microseconds).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "ddprun/backends.h"
#include "deadline.h"
#include "rendezvous/store/store.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::sdk {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt8:
      return ncclUint8;
  }
  throw std::invalid_argument("nccl: unknown DType " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  throw std::invalid_argument("nccl: unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

std::string describe_call(const char* op, size_t count, DType dtype) {
  return std::string("nccl ") + op + "(" + dtype_name(dtype) + " x " + std::to_string(count) + ")";
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": CUDA error: " + cudaGetErrorString(e));
}

std::string nccl_version_text() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL ?";
  // NCCL_VERSION_CODE >= 2.9: major*10000 + minor*100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(rdzv::Store& store, const std::string& prefix, int rank, int size, int device,
                   const ProcessGroupOptions& options)
      : ProcessGroup(rank, size), device_(device), options_(options) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw std::invalid_argument("make_nccl_process_group: rank " + std::to_string(rank) +
                                  " outside world size " + std::to_string(size));
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      throw std::runtime_error(std::string("make_nccl_process_group: no CUDA device visible (") +
                               (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) +
                               "); use the CPU backend (ddprun::sdk::Backend::kCpu)");
    }
    if (device < 0 || device >= count) {
      throw std::invalid_argument("make_nccl_process_group: device " + std::to_string(device) +
                                  " (LOCAL_RANK) but " + std::to_string(count) +
                                  " CUDA devices are visible: use --nproc_per_node <= the GPU count");
    }
    try {
      bootstrap(store, prefix);
    } catch (...) {
      std::unique_lock lock(op_mu_);
      release(lock);
      throw;
    }
  }

  ~NcclProcessGroup() override {
    std::unique_lock lock(op_mu_);
    release(lock);
  }

  const char* backend() const override { return "nccl"; }
  int device_index() const override { return device_; }
  std::string describe() const override {
    return "nccl: cuda:" + std::to_string(device_) + ", " + std::to_string(size()) + " ranks, " +
           nccl_version_text();
  }

  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    const auto type = nccl_type(dtype);
    const auto red = nccl_op(op);
    run(describe_call("all_reduce", count, dtype), count,
        [&] { return ncclAllReduce(data, data, count, type, red, comm_, stream_); });
  }

  void broadcast(void* data, size_t count, DType dtype, int root) override {
    if (root < 0 || root >= size()) {
      throw std::invalid_argument("nccl broadcast: root " + std::to_string(root) + " outside world size " +
                                  std::to_string(size()));
    }
    const auto type = nccl_type(dtype);
    run(describe_call("broadcast", count, dtype) + " from rank " + std::to_string(root), count,
        [&] { return ncclBroadcast(data, data, count, type, root, comm_, stream_); });
  }

  void all_gather(const void* in, void* out, size_t count, DType dtype) override {
    const auto type = nccl_type(dtype);
    run(describe_call("all_gather", count, dtype), count,
        [&] { return ncclAllGather(in, out, count, type, comm_, stream_); });
  }

  void barrier() override {
    run("nccl barrier", 1,
        [&] { return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }

  void abort() override {
    {
      std::lock_guard g(reason_mu_);
      if (reason_.empty()) reason_ = "abort() was called on rank " + std::to_string(rank());
    }
    aborted_.store(true, std::memory_order_release);
    // A collective in flight holds op_mu_ and aborts the communicator on its next poll.
    std::unique_lock lock(op_mu_, std::try_to_lock);
    if (lock.owns_lock()) abort_comm(lock);
  }

 private:
  void bootstrap(rdzv::Store& store, const std::string& prefix) {
    Deadline deadline(options_.timeout);
    check_cuda(cudaSetDevice(device_),
               "make_nccl_process_group: cudaSetDevice(" + std::to_string(device_) + ")");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "make_nccl_process_group: stream");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "make_nccl_process_group: event");
    check_cuda(cudaMalloc(&barrier_buf_, sizeof(float)), "make_nccl_process_group: barrier buffer");
    check_cuda(cudaMemset(barrier_buf_, 0, sizeof(float)), "make_nccl_process_group: barrier buffer");

    ncclUniqueId id;
    exchange_unique_id(store, prefix + "/nccl_unique_id", id, deadline);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    std::unique_lock lock(op_mu_);
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size(), id, rank(), &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      comm_ = nullptr;  // nothing to abort
      fail(lock, "nccl bootstrap: ncclCommInitRankConfig: " + nccl_error_text(r), deadline);
    }
    wait_comm_ready(lock, "nccl bootstrap (ncclCommInitRankConfig)", deadline);
  }

  // Frees the communicator (ncclCommAbort), the stream, the event and the barrier buffer.
  void release(std::unique_lock<std::mutex>& lock) {
    abort_comm(lock);
    cudaSetDevice(device_);
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
    barrier_buf_ = nullptr;
    done_ = nullptr;
    stream_ = nullptr;
  }

  void exchange_unique_id(rdzv::Store& store, const std::string& key, ncclUniqueId& id,
                          const Deadline& deadline) {
    if (rank() == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) {
        throw CollectiveError("nccl bootstrap: ncclGetUniqueId: " + std::string(ncclGetErrorString(r)), -1);
      }
      store.set(key, std::string_view(reinterpret_cast<const char*>(&id), sizeof id));
      return;
    }
    std::string value;
    try {
      store.wait({key}, deadline.remaining());
      value = store.get(key);
    } catch (const rdzv::TimeoutError&) {
      throw CollectiveError("nccl bootstrap on rank " + std::to_string(rank()) +
                                ": rank 0 did not publish the NCCL " + "unique id within " +
                                deadline.elapsed_text(),
                            0);
    } catch (const rdzv::StoreError& e) {
      throw CollectiveError("nccl bootstrap on rank " + std::to_string(rank()) + ": store error: " + e.what(),
                            -1);
    }
    if (value.size() != sizeof id) {
      throw CollectiveError("nccl bootstrap: the unique id published by rank 0 has " +
                                std::to_string(value.size()) + " bytes, expected " +
                                std::to_string(sizeof id) + " (different NCCL builds?)",
                            0);
    }
    std::memcpy(&id, value.data(), sizeof id);
  }

  // Launches one collective and waits for it on the device; the whole call is bounded by options_.timeout.
  template <class Launch>
  void run(const std::string& what, size_t count, Launch&& launch) {
    std::unique_lock lock(op_mu_);
    Deadline deadline(options_.timeout);
    if (aborted_.load(std::memory_order_acquire) || comm_ == nullptr) {
      abort_comm(lock);
      throw CollectiveError(
          what + " on rank " + std::to_string(rank()) + ": the process group is aborted (" + reason() + ")",
          -1);
    }
    if (count == 0) return;
    cudaError_t ce = cudaSetDevice(device_);
    if (ce != cudaSuccess) fail(lock, what + ": cudaSetDevice: " + cudaGetErrorString(ce), deadline);
    ncclResult_t r = launch();
    if (r != ncclSuccess && r != ncclInProgress) fail(lock, what + ": " + nccl_error_text(r), deadline);
    wait_comm_ready(lock, what, deadline);  // non-blocking communicator: the enqueue may still be under way
    ce = cudaEventRecord(done_, stream_);
    if (ce != cudaSuccess) fail(lock, what + ": cudaEventRecord: " + cudaGetErrorString(ce), deadline);
    for (int spins = 0;; ++spins) {
      ce = cudaEventQuery(done_);
      if (ce == cudaSuccess) return;
      if (ce != cudaErrorNotReady) fail(lock, what + ": CUDA error: " + cudaGetErrorString(ce), deadline);
      poll_errors(lock, what, deadline);
      backoff(spins);
    }
  }

  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress.
  void wait_comm_ready(std::unique_lock<std::mutex>& lock, const std::string& what,
                       const Deadline& deadline) {
    for (int spins = 0;; ++spins) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) fail(lock, what + ": ncclCommGetAsyncError: " + nccl_error_text(r), deadline);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(lock, what + ": " + nccl_error_text(state), deadline);
      check_abort_and_deadline(lock, what, deadline);
      backoff(spins);
    }
  }

  void poll_errors(std::unique_lock<std::mutex>& lock, const std::string& what, const Deadline& deadline) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail(lock, what + ": ncclCommGetAsyncError: " + nccl_error_text(r), deadline);
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(lock,
           what + ": asynchronous NCCL error (a peer died or the network failed): " + nccl_error_text(state),
           deadline);
    }
    check_abort_and_deadline(lock, what, deadline);
  }

  void check_abort_and_deadline(std::unique_lock<std::mutex>& lock, const std::string& what,
                                const Deadline& deadline) {
    if (aborted_.load(std::memory_order_acquire)) fail(lock, what + ": aborted (" + reason() + ")", deadline);
    if (deadline.expired()) {
      fail(lock,
           what +
               ": timed out waiting for the other ranks (NCCL does not name the peer: a rank died, hangs, or "
               "called a different collective)",
           deadline);
    }
  }

  // Spin briefly (collectives of small buffers finish in microseconds), then sleep in growing steps up to
  // 1 ms so a long wait costs no CPU.
  static void backoff(int spins) {
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (spins - 63))));
    }
  }

  std::string nccl_error_text(ncclResult_t r) const {
    std::string text = ncclGetErrorString(r);
    if (comm_ != nullptr) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) text += " (" + std::string(last) + ")";
    }
    return text;
  }

  [[noreturn]] void fail(std::unique_lock<std::mutex>& lock, const std::string& what,
                         const Deadline& deadline) {
    {
      std::lock_guard g(reason_mu_);
      if (reason_.empty()) reason_ = what;
    }
    aborted_.store(true, std::memory_order_release);
    std::string msg = what + " on rank " + std::to_string(rank()) + " after " + deadline.elapsed_text();
    abort_comm(lock);
    throw CollectiveError(msg, -1);
  }

  void abort_comm(std::unique_lock<std::mutex>&) {
    if (comm_ == nullptr) return;
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_.store(true, std::memory_order_release);
  }

  std::string reason() const {
    std::lock_guard g(reason_mu_);
    return reason_.empty() ? "unknown reason" : reason_;
  }

  const int device_;
  const ProcessGroupOptions options_;
  std::mutex op_mu_;           // held for a whole collective, the bootstrap and abort_comm
  ncclComm_t comm_ = nullptr;  // guarded by op_mu_; nullptr once aborted
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* barrier_buf_ = nullptr;
  std::atomic<bool> aborted_{false};
  mutable std::mutex reason_mu_;
  std::string reason_;  // guarded by reason_mu_: the first failure, for later calls' messages
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_process_group(rdzv::Store& store, const std::string& prefix, int rank,
                                                      int size, int device,
                                                      const ProcessGroupOptions& options) {
  return std::make_unique<NcclProcessGroup>(store, prefix, rank, size, device, options);
}

bool nccl_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace ddprun::sdk
