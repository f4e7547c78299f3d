// ProcessGroup: collectives among the workers of one ddprun job — the worker SDK's transport interface.
//
// Buffers are raw memory (host memory for the CPU backend, device memory for NCCL) described by a pointer,
// an element count and a DType, so the interface needs no libtorch; ddprun/tensor_ops.h adapts torch::Tensor.
// Every rank must call the same collectives in the same order with the same sizes (as with NCCL and gloo).
//
// Deadlines: every call completes within `timeout` (ProcessGroupOptions::timeout unless given) or throws
// CollectiveError naming the operation, the peer it was waiting for and the elapsed time — a dead peer gives
// an error, never a hang, so the agent can restart the group. After a CollectiveError the group is broken:
// every later call throws at once (abort()).
//
// Threads: a group is used by one thread at a time (the training loop or the gradient synchroniser's
// thread); calls are blocking unless stated otherwise.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace ddprun::sdk {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* reduce_op_name(ReduceOp op);

// A collective failed or timed out; the message names the op, the peer rank and the elapsed time.
class CollectiveError : public std::runtime_error {
 public:
  CollectiveError(const std::string& what, int peer) : std::runtime_error(what), peer_(peer) {}
  int peer() const { return peer_; }  // -1 when unknown

 private:
  int peer_;
};

// How the CPU backend moves data between ranks (see backends.h).
enum class CpuTransport : uint8_t {
  kAuto,  // shared memory among the ranks of one host, a TCP ring between hosts (hierarchical when both)
  kTcp,   // every rank acts as a host of its own: the TCP ring even on one host (tests, comparisons)
};

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout{300000};  // the bootstrap, and each collective call

  // CPU backend only; the defaults suit real jobs, the other values exist for tests and benchmarks.
  CpuTransport cpu_transport = CpuTransport::kAuto;
  // Ranks with equal host ids share memory. "" = detect: hostname, /proc/sys/kernel/random/boot_id and the
  // pid namespace, so two containers on one machine count as two hosts.
  std::string host_id;
  // IPv4 address peers use to reach this rank's TCP listener (bound to 0.0.0.0, port 0). "" = the local
  // address that routes to $MASTER_ADDR, else 127.0.0.1.
  std::string advertise_address;
  // Chunk of the shared-memory path; a host segment holds 4(n+1)+8 such slots plus 64 KiB per rank.
  size_t shm_slot_bytes = size_t{256} << 10;
  size_t tcp_segment_bytes = size_t{128} << 10;  // pipelining granularity of the ring
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual const char* backend() const = 0;
  // The CUDA device whose memory the collectives take (the NCCL backend); -1 for host memory.
  virtual int device_index() const { return -1; }
  // How data moves, for logs and benchmarks, e.g. "cpu: shm(4)" or "cpu: shm(2) x tcp-ring(3 hosts)".
  virtual std::string describe() const { return backend(); }

  // In place: data[0..count) of every rank becomes the reduction over all ranks, bit-identical on every rank.
  // kAvg divides by size() (integer types: truncating division); integer sums wrap around; fp16/bf16 are
  // combined in float and rounded to nearest-even.
  virtual void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // data[0..count) of `root` is copied to every rank.
  virtual void broadcast(void* data, size_t count, DType dtype, int root) = 0;
  // out[r*count .. (r+1)*count) = in of rank r. `out` holds size()*count elements.
  virtual void all_gather(const void* in, void* out, size_t count, DType dtype) = 0;
  virtual void barrier() = 0;
  // Makes every pending and later call fail at once (used on timeouts and by the synchroniser). Thread-safe:
  // may be called while another thread is blocked in a collective. The CPU backend also makes the peers'
  // pending and later calls fail promptly (their error names this rank) instead of waiting for the timeout.
  virtual void abort() = 0;

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_;
  int size_;
};

}  // namespace ddprun::sdk
