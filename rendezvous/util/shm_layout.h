// ShmLayout: what lives where in the worker SDK's shared-memory segment (worker_sdk/src/shm_segment.h), one
// per host and job, created by local rank 0 in /dev/shm. Here, below both, because the agent's health check
// (agent/health/health_check.h) asks whether /dev/shm has room for it before the node joins.
//
// Pure arithmetic on sizes; thread-safe; never throws.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ddprun {

// The SDK's default chunk size (ProcessGroupOptions::shm_slot_bytes; DDPRUN_SHM_SLOT_BYTES overrides it),
// and the range the override must lie in.
constexpr size_t kDefaultShmSlotBytes = size_t{256} << 10;
constexpr size_t kMinShmSlotBytes = 4096;
constexpr size_t kMaxShmSlotBytes = size_t{1} << 30;

// DDPRUN_SHM_SLOT_BYTES as the SDK reads it: "" is the default; else a decimal byte count within
// [kMinShmSlotBytes, kMaxShmSlotBytes], or nullopt (the SDK refuses it at init). One reader for the SDK and
// the agent's health check, so both size the same segment.
std::optional<size_t> shm_slot_bytes(std::string_view text);

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

}  // namespace ddprun
