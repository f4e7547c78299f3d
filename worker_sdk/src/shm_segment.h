// ShmSegment: one POSIX shared-memory segment (shm_open + mmap), created by one process and attached by
// the others of a host. The fixed layout the shared-memory collectives use inside it is ShmLayout
// (rendezvous/util/shm_layout.h: the agent checks that /dev/shm has room for it).
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

#include "rendezvous/util/shm_layout.h"

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

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "cross-process atomics must be lock-free");

}  // namespace ddprun::sdk
