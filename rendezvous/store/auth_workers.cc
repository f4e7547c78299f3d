#include "rendezvous/store/auth_workers.h"

#include <algorithm>
#include <utility>

namespace ddprun::rdzv {

AuthWorkers::AuthWorkers(size_t threads, size_t max_queued)
    : threads_(std::max<size_t>(1, threads)), max_queued_(max_queued) {}

AuthWorkers::~AuthWorkers() {
  stop();
}

bool AuthWorkers::submit(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    if (stopped_ || jobs_.size() >= max_queued_) return false;
    jobs_.push_back(std::move(job));
    if (workers_.empty()) {
      for (size_t i = 0; i < threads_; ++i) workers_.emplace_back([this] { work(); });
    }
  }
  wake_.notify_one();
  return true;
}

void AuthWorkers::stop() {
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    jobs_.clear();
    workers.swap(workers_);
  }
  wake_.notify_all();
  for (auto& t : workers) t.join();
}

size_t AuthWorkers::queued() const {
  std::lock_guard lock(mu_);
  return jobs_.size();
}

void AuthWorkers::work() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [this] { return stopped_ || !jobs_.empty(); });
      if (stopped_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace ddprun::rdzv
