#include "rendezvous/store/refusal_log.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace ddprun::rdzv {

namespace {

constexpr std::chrono::minutes kMinute{1};

}  // namespace

std::string source_of(const std::string& address) {
  in6_addr a{};
  if (address.find(':') == std::string::npos || ::inet_pton(AF_INET6, address.c_str(), &a) != 1)
    return address;
  std::memset(a.s6_addr + 8, 0, 8);
  char text[INET6_ADDRSTRLEN] = "";
  ::inet_ntop(AF_INET6, &a, text, sizeof text);
  return std::string(text) + "/64";
}

RefusalLog::RefusalLog(size_t max_sources, size_t lines_per_minute)
    : max_sources_(max_sources == 0 ? 1 : max_sources), lines_per_minute_(lines_per_minute) {}

bool RefusalLog::should_log(const std::string& address, Clock::time_point now, uint64_t& unlogged) {
  // Sources logged a minute ago or more may be logged again: forget them, oldest first.
  while (!order_.empty() && now - order_.front().first >= kMinute) {
    if (auto it = last_.find(order_.front().second);
        it != last_.end() && it->second == order_.front().first) {
      last_.erase(it);
    }
    order_.pop_front();
  }
  std::string source = source_of(address);
  if (now - window_start_ >= kMinute) {
    window_start_ = now;
    lines_ = 0;
  }
  if (last_.count(source) || lines_ >= lines_per_minute_) {
    ++unlogged_;
    return false;
  }
  ++lines_;
  last_[source] = now;
  order_.emplace_back(now, std::move(source));
  if (order_.size() > max_sources_) {  // full: the oldest source may be logged again before its minute
    last_.erase(order_.front().second);
    order_.pop_front();
  }
  unlogged = std::exchange(unlogged_, 0);
  return true;
}

}  // namespace ddprun::rdzv
