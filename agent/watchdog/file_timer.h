// torch's FileTimer protocol, served like torchrun: with TORCHELASTIC_ENABLE_FILE_TIMER=1 in the agent's
// environment, the agent creates a named pipe (TORCHELASTIC_TIMER_FILE if set, else one in its run
// directory) and gives its path to every worker as TORCHELASTIC_TIMER_FILE. Workers use torch's
// torch.distributed.elastic.timer.FileTimerClient (`expires(after=60)` blocks), which opens the pipe,
// writes one JSON line and closes it:
//
//   {"version": 1, "pid": 4242, "scope_id": "load", "expiration_time": 1764000000.5, "signal": 9}
//
// expiration_time is Unix time in seconds; a negative one releases the (pid, scope_id) timer. torch 1.13 and
// 2.x write the same line. When timers of a pid expire, the one that expires first among those with a signal
// > 0 is reported (torch sends that signal to that pid); all the pid's timers are then dropped, also the ones
// without a signal (torch logs "Do not reap it" for those). A malformed line is logged and skipped.
//
// TimerTable and parse_timer_request are pure. FileTimerServer runs on an io_context (one thread, like
// ProcessContext): construct, use and destroy it there or while io is not running.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddprun::agent {

struct TimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // Unix seconds; < 0: release
  int signal = 0;
  bool operator==(const TimerRequest&) const = default;
};

// One line of the pipe; nullopt and `error` set when it is not a timer request.
std::optional<TimerRequest> parse_timer_request(std::string_view line, std::string& error);

class TimerTable {
 public:
  void apply(const TimerRequest& r);
  // The timers expired at `now`: per pid, the earliest one with a signal > 0, or (when none has one) the
  // earliest with its signal 0. Every timer of those pids is dropped.
  std::vector<TimerRequest> take_expired(double now);
  // The earliest expiration time of any timer.
  std::optional<double> next_expiration() const;
  size_t size() const { return timers_.size(); }

 private:
  std::map<std::pair<pid_t, std::string>, TimerRequest> timers_;
};

class FileTimerServer {
 public:
  using ExpiredFn = std::function<void(const TimerRequest&)>;

  // Creates the FIFO `path` (mode 0666 & ~umask, as os.mkfifo; an existing FIFO is reused, anything else
  // there is an error) and starts reading it on `io`. on_expired runs on io's thread. Throws
  // std::system_error naming the path.
  FileTimerServer(boost::asio::io_context& io, std::filesystem::path path, ExpiredFn on_expired);
  // Stops reading and removes the FIFO.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::filesystem::path& path() const;
  // Requests read so far (any thread): a heartbeat of the workers for hang detection.
  uint64_t requests() const;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
