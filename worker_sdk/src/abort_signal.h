// AbortSignal: the process-local "this group is broken" flag of the CPU backend.
//
// raise() may be called from any thread (ProcessGroup::abort() while a collective is blocked in another):
// it sets the flag and makes fd() readable, so a thread blocked in poll() with fd() in its set wakes up, and
// spin-waits that check raised() stop. The first reason given is kept for later error messages.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include "ddprun/process_group.h"

namespace ddprun::sdk {

class AbortSignal {
 public:
  AbortSignal();  // throws std::system_error when no pipe can be made
  ~AbortSignal();
  AbortSignal(const AbortSignal&) = delete;
  AbortSignal& operator=(const AbortSignal&) = delete;

  // Idempotent; returns true for the call that raised it. `peer`: the rank blamed (-1 unknown).
  bool raise(const std::string& reason, int peer);
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  int fd() const { return read_fd_; }  // readable once raised
  std::string reason() const;
  int peer() const;
  // Throws CollectiveError("aborted: <reason>", peer()) once raised.
  void throw_if_raised() const;

 private:
  std::atomic<bool> raised_{false};
  int read_fd_ = -1;
  int write_fd_ = -1;
  mutable std::mutex mu_;
  std::string reason_;  // guarded by mu_
  int peer_ = -1;       // guarded by mu_
};

}  // namespace ddprun::sdk
