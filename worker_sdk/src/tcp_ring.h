// TcpRing: collectives among the members of a ring over TCP — one connection to the next member (sends
// only) and one from the previous (receives only).
//
// All-reduce is the bandwidth-optimal ring: reduce-scatter then all-gather, n-1 steps each, so every member
// sends and receives 2(n-1)/n of the buffer. It is pipelined: each step's block is streamed in segments of
// `segment_bytes`, a segment is reduced as soon as it has arrived, and forwarding a block in the next step
// starts as soon as its first segment is reduced — so sending, receiving and reducing overlap. One thread,
// non-blocking sockets and poll(). all_gatherv is the all-gather half; broadcast streams along the ring
// from the root; barrier is a small all-reduce (every member's contribution is needed for it to finish).
//
// Deadlines and failures: every call gives up at the deadline with CollectiveError naming the neighbour it
// was waiting for; EOF or a reset from a neighbour is reported at once, naming it. After an error the
// byte streams are out of step: the ring must not be used again (the process group aborts it).
// shutdown() may be called from any thread: both connections are shut down, which wakes a pending call
// here (through the AbortSignal) and makes the neighbours' pending calls fail at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "abort_signal.h"
#include "ddprun/process_group.h"
#include "deadline.h"
#include "tcp_socket.h"

namespace ddprun::sdk {

class TcpRing {
 public:
  struct Member {
    int rank;  // global rank, for messages
    std::string host;
    uint16_t port;
  };

  // Connects to the next member and accepts the previous one (hello checked against `tag`).
  TcpRing(TcpListener& listener, std::vector<Member> members, int me, uint64_t tag, size_t segment_bytes,
          AbortSignal& abort, const Deadline& deadline);

  int size() const { return static_cast<int>(members_.size()); }

  // In place; kAvg reduces as kSum and the owner of each block divides it by `divisor` before it is
  // distributed, so every member gets bit-identical results.
  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, int divisor, const Deadline& deadline);
  // Member k's block is out[offsets[k] .. offsets[k]+lens[k]); this member's block must already be there.
  void all_gatherv(void* out, const std::vector<size_t>& offsets, const std::vector<size_t>& lens,
                   const Deadline& deadline);
  void broadcast(void* data, size_t bytes, int root, const Deadline& deadline);  // root: member index
  void barrier(const Deadline& deadline);
  void shutdown();

 private:
  struct Step {
    size_t send_off = 0, send_len = 0;
    size_t recv_off = 0, recv_len = 0;
    bool reduce = false;  // received bytes are reduced into the buffer (else copied)
    int divisor = 1;      // reduce steps: divide before rounding (the last reduce-scatter step of kAvg)
    int gate = -1;        // step whose processed received bytes bound what this step may send
  };

  void run(std::byte* buf, const std::vector<Step>& steps, DType dtype, ReduceOp op,
           const Deadline& deadline);
  [[noreturn]] void fail_io(bool sending, int err);
  int next_rank() const;
  int prev_rank() const;

  std::vector<Member> members_;
  int me_;
  size_t segment_bytes_;
  AbortSignal& abort_;
  UniqueFd next_;
  UniqueFd prev_;
  std::vector<std::byte> staging_;
  int rcvlowat_ = 1;  // SO_RCVLOWAT now set on prev_
};

}  // namespace ddprun::sdk
