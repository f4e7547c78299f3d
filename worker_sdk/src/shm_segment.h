// ShmSegment: one POSIX shared-memory segment (shm_open + mmap), created by one process and attached by
// the others of a host, and the fixed layout the shared-memory collectives use inside it.
//
// Lifetime: the creator makes the name with O_EXCL; once every process has attached, the creator unlinks
// the name (unlink()), so nothing is left in /dev/shm when the processes exit, even by SIGKILL. The
// destructor unmaps, and unlinks too when the creator never got to it (error paths).
// Errors: std::system_error naming the segment and the call that failed. create() reserves the segment's
// pages (posix_fallocate): a /dev/shm without room is an error here (ENOSPC, shm_full_message's text), never
// a SIGBUS at the first write; nothing is left in /dev/shm after an error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace ddprun::sdk {

// The error for a /dev/shm too small for `bytes`: the segment, the bytes needed and free, and what to do.
std::string shm_full_message(const std::string& name, size_t bytes);

class ShmSegment {
 public:
  static std::unique_ptr<ShmSegment> create(const std::string& name, size_t bytes);
  static std::unique_ptr<ShmSegment> attach(const std::string& name);  // maps the whole segment
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  void unlink();  // idempotent
  std::byte* base() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, std::byte* base, size_t size, bool owner)
      : name_(std::move(name)), base_(base), size_(size), owner_(owner) {}

  std::string name_;
  std::byte* base_;
  size_t size_;
  bool owner_;
  bool unlinked_ = false;
};

// What lives where in the segment of a group of `nranks` local ranks. Data areas are 4 KiB aligned.
//   header | pids[n] | sync[n] (one cache line each) | small[2][n] | sets[kSets] of (slots[n], result) |
//   bcast[2]
struct ShmLayout {
  static constexpr uint64_t kMagic = 0x64647072756e5348ull;  // "ddprunSH"
  static constexpr size_t kSmallBytes = 32 << 10;            // per rank and parity: the one-wait path
  static constexpr int kSets = 4;                            // chunks of a large all-reduce in flight

  struct Header {
    uint64_t magic;
    uint64_t total_bytes;
    uint64_t slot_bytes;
    uint32_t nranks;
    std::atomic<uint32_t> attached;
    // 0 while healthy; else ((reporter+1) << 32) | (blamed+1), global ranks (blamed -1 encodes as 0).
    std::atomic<uint64_t> abort_word;
  };

  // Progress of one rank, written only by it (release), read by all (acquire). All counts are cumulative
  // over the group's life, so they mean the same step on every rank.
  struct alignas(64) RankSync {
    std::atomic<uint64_t> epoch;     // steps of broadcast, all_gather, barrier and small all-reduce
    std::atomic<uint64_t> in_done;   // large all-reduce chunks copied into this rank's slot
    std::atomic<uint64_t> red_done;  // ... whose part this rank has reduced into the result
    std::atomic<uint64_t> out_done;  // ... copied out of the result (their set is free again)
  };

  ShmLayout(int nranks, size_t slot_bytes);
  size_t slot_off(int set, int i) const { return sets_off + (set * (nranks + 1) + i) * slot_bytes; }
  size_t result_off(int set) const { return slot_off(set, nranks); }

  int nranks;
  size_t slot_bytes;
  size_t bcast_bytes;  // each of the two broadcast halves
  size_t pids_off, sync_off, small_off, sets_off, bcast_off, total_bytes;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "cross-process atomics must be lock-free");

}  // namespace ddprun::sdk
