#include "agent/loop/event_queue.h"

#include <algorithm>
#include <functional>
#include <utility>

namespace ddprun::agent {

void EventQueue::push(Event e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_one();
}

bool EventQueue::pop(Event& out, std::optional<Clock::time_point> deadline) {
  std::unique_lock lock(mu_);
  auto ready = [&] { return !events_.empty(); };
  if (deadline) {
    if (!cv_.wait_until(lock, *deadline, ready)) return false;
  } else {
    cv_.wait(lock, ready);
  }
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool EventQueue::wait_for(const std::function<bool(const Event&)>& wanted, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline,
                        [&] { return std::any_of(events_.begin(), events_.end(), std::cref(wanted)); });
}

}  // namespace ddprun::agent
