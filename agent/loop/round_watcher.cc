#include "agent/loop/round_watcher.h"

#include <chrono>

namespace ddprun::agent {

void RoundWatcher::start(int round) {
  stop_ = false;
  thread_ = std::thread([this, round] {
    while (!stop_) {
      try {
        if (auto stop = rdzv_.wait_round_stopped(std::chrono::milliseconds(1000))) {
          events_.push(Event{.kind = Event::Kind::kRoundStopped, .stop = *stop, .round = round});
          return;
        }
      } catch (const std::exception& e) {
        events_.push(Event{.kind = Event::Kind::kWatcherError, .error = e.what(), .round = round});
        return;
      }
    }
  });
}

void RoundWatcher::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace ddprun::agent
