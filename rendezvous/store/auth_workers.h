// AuthWorkers: a few threads that run the store's blocking AUTH steps (StoreSession::AuthStep with MUNGE, a
// round trip to munged each) so that the store's event loop never waits for munged (docs/security.md).
//
// Jobs run in the order they were submitted; at most `max_queued` wait at once: submit() refuses more (the
// store then refuses that handshake, saying so). The threads start with the first job: a store whose auth
// never blocks starts none.
//
// Threads: submit() and stop() from any thread. A job runs on a worker thread and must not throw. stop()
// drops the jobs that have not started and joins the threads (waiting for the jobs that run: each is bounded
// by libmunge's own timeout); after it, submit() refuses.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ddprun::rdzv {

class AuthWorkers {
 public:
  AuthWorkers(size_t threads, size_t max_queued);
  ~AuthWorkers();  // stop()
  AuthWorkers(const AuthWorkers&) = delete;
  AuthWorkers& operator=(const AuthWorkers&) = delete;

  // False when `max_queued` jobs wait already, or after stop().
  bool submit(std::function<void()> job);
  void stop();
  // Jobs waiting for a thread.
  size_t queued() const;
  size_t max_queued() const { return max_queued_; }

 private:
  void work();

  const size_t threads_;
  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  std::vector<std::thread> workers_;        // guarded by mu_ (started by the first submit)
  bool stopped_ = false;                    // guarded by mu_
};

}  // namespace ddprun::rdzv
