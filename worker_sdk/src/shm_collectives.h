// ShmCollectives: all-reduce, broadcast, all-gather and barrier among the ranks of one host through one
// shared-memory segment (ShmSegment), with no futex and no lock.
//
// Synchronisation: each rank owns one cache line of progress counters in the segment (ShmLayout::RankSync)
// that only it writes, with release stores; a rank waits for the counters it depends on with acquire
// loads: a short spin (none when the host has more local ranks than CPUs), then sched_yield, then nanosleep
// backing off to 50 us. Every rank performs the same sequence of steps, so counter values name the same step
// on every rank.
//
// All-reduce, small buffers (<= 32 KiB): every rank copies into its slot, one wait, every rank reduces all
// slots (double-buffered, so one wait per call). Larger buffers go in chunks of `slot_bytes` through
// kSets sets of (n slots + result), as a dataflow: a rank copies chunk c into its slot of set c % kSets once
// every rank has copied chunk c - kSets out; reduces its part (1/n) of chunk c over all slots into the
// result once every rank has copied chunk c in; copies chunk c out once every rank has reduced its part.
// A rank does whatever step is ready (reduce, then copy in, then copy out) and waits only when none is,
// so ranks run ahead of each other by up to kSets chunks and block rarely. A rank's own part never goes
// through its slot: it is reduced in place in the rank's buffer and then published in the result area, so
// per rank a large all-reduce moves 2(n-1)/n of the buffer through shared memory plus one reduction pass.
// Buffers of 4 MiB and more are copied out with streaming stores. Results are bit-identical on every rank.
//
// Deadlines and failures: every wait gives up at the deadline with CollectiveError naming the first rank
// that has not arrived. While waiting, the pids of the ranks not arrived are checked about every 10 ms
// (kill(pid, 0) and zombie state), so a dead peer is reported within milliseconds. poison() marks the
// segment broken; every waiting rank then fails at once, blaming the rank named there. The process-local
// AbortSignal is checked in every wait iteration.
//
// Threads: one caller thread at a time; the AbortSignal may be raised from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "abort_signal.h"
#include "ddprun/process_group.h"
#include "deadline.h"
#include "shm_segment.h"

namespace ddprun::rdzv {
class Store;
}

namespace ddprun::sdk {

class ShmCollectives {
 public:
  // `ranks`: the global ranks of this host's group in local order; `me`: my index in it. Local index 0
  // creates the segment and publishes its name at store key `key`; the others attach. Returns once this
  // rank is attached (the creator: once all are, then it unlinks the name). Throws CollectiveError on
  // timeout (naming a rank that did not attach) or when the segment cannot be made.
  ShmCollectives(rdzv::Store& store, const std::string& key, std::vector<int> ranks, int me,
                 size_t slot_bytes, AbortSignal& abort, const Deadline& deadline);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // In place; kAvg reduces as kSum and divides by `divisor` before the final rounding. copy_out=false:
  // only valid for the large path's result, this rank's buffer is left unspecified (it will be broadcast).
  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, int divisor, bool copy_out,
                  const Deadline& deadline);
  void broadcast(void* data, size_t bytes, int root, const Deadline& deadline);  // root: local index
  // out[k*bytes .. (k+1)*bytes) = in of local rank k.
  void all_gather(const void* in, void* out, size_t bytes, const Deadline& deadline);
  void barrier(const Deadline& deadline);

  // Marks the segment broken: every local rank waiting in it throws, blaming global rank `blamed`.
  void poison(int blamed);

 private:
  ShmLayout::RankSync& sync(int i) const;
  std::atomic<int32_t>& pid(int i) const;
  std::byte* small_slot(int parity, int i) const;
  std::byte* slot(int set, int i) const;
  std::byte* result(int set) const;
  std::byte* bcast(int parity) const;
  ShmLayout::Header& header() const;

  void arrive();
  // Waits until every rank's (or only rank `only`'s) counter `field` is >= target.
  void wait_for(int only, uint64_t target, const Deadline& deadline,
                std::atomic<uint64_t> ShmLayout::RankSync::*field = &ShmLayout::RankSync::epoch);
  // The first local rank whose `field` is below target (-1: none).
  int behind(std::atomic<uint64_t> ShmLayout::RankSync::*field, uint64_t target) const;
  // Spin/yield/sleep until ready() (a cheap predicate) holds; blame() names the local rank waited for.
  template <class Ready, class Blame>
  void wait_until(Ready&& ready, Blame&& blame, const Deadline& deadline);
  void check_failures(int blamed_local, bool check_pids);
  void wait_attached(const Deadline& deadline);
  void large_all_reduce(std::byte* buf, size_t count, DType dtype, ReduceOp op, int divisor, bool copy_out,
                        const Deadline& deadline);

  std::vector<int> ranks_;
  int n_;
  int me_;
  std::vector<const void*> srcs_;  // reduction sources, sized n_ once (no allocation per call)
  AbortSignal& abort_;
  ShmLayout layout_;
  std::unique_ptr<ShmSegment> segment_;
  bool oversubscribed_ = false;  // more local ranks than CPUs: yield instead of spinning
  uint64_t epoch_ = 0;           // my RankSync::epoch
  uint64_t chunks_ = 0;          // large all-reduce chunks completed by this rank (all its counters)
  int small_parity_ = 0;
  int bcast_parity_ = 0;
};

// True while `pid` exists and is not a zombie.
bool process_alive(int pid);

}  // namespace ddprun::sdk
