// Event and EventQueue: what the agent loop (agent/loop/agent_loop.h) is told by its other threads. The io
// thread reports worker exits, a stopped worker group, signals and expired FileTimer deadlines; the store
// watcher reports that the round was stopped (by any node) or that the store was lost.
//
// EventQueue is a FIFO: many producers (any thread), one consumer (the loop). push never blocks beyond the
// queue's mutex; pop blocks until an event arrives or its deadline passes. Unbounded (a few events per
// worker per round). Never throws, except std::bad_alloc.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "agent/process/worker_launch.h"
#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/util/unix_time.h"

namespace ddprun::agent {

struct Event {
  enum class Kind { kWorkerExited, kGroupStopped, kRoundStopped, kWatcherError, kSignal, kDeadlineMissed };
  Kind kind = Kind::kSignal;
  int local_rank = 0;    // kWorkerExited
  pid_t pid = 0;         // kWorkerExited, kDeadlineMissed
  ExitStatus status;     // kWorkerExited
  double time = 0;       // kWorkerExited: seconds since the Unix epoch (unix_now)
  rdzv::RoundStop stop;  // kRoundStopped
  std::string error;     // kWatcherError; kDeadlineMissed: the timer's scope
  int signal = 0;        // kSignal; kDeadlineMissed: the signal the timer asked for
  int round = -1;        // kRoundStopped/kWatcherError: the round the watcher watched
};

class EventQueue {
 public:
  using Clock = std::chrono::steady_clock;

  // Appends `e` and wakes the consumer. Thread-safe.
  void push(Event e);
  // Waits for the next event until `deadline` (nullopt: forever). Returns false on the deadline (`out`
  // untouched). One consumer at a time.
  bool pop(Event& out, std::optional<Clock::time_point> deadline);
  // Waits until a queued event is `wanted` (true; every event stays queued) or `deadline` passes (false).
  // The consumer only.
  bool wait_for(const std::function<bool(const Event&)>& wanted, Clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;  // guarded by mu_
};

}  // namespace ddprun::agent
