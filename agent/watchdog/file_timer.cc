#include "agent/watchdog/file_timer.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

namespace ddprun::agent {

namespace asio = boost::asio;

std::optional<TimerRequest> parse_timer_request(std::string_view line, std::string& error) {
  auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  auto number = [&](const char* key) { return j.contains(key) && j[key].is_number(); };
  if (!number("pid") || !j.contains("scope_id") || !j["scope_id"].is_string() || !number("expiration_time") ||
      !number("signal")) {
    error = "expected pid, scope_id, expiration_time and signal";
    return std::nullopt;
  }
  return TimerRequest{.pid = j["pid"].get<pid_t>(),
                      .scope_id = j["scope_id"].get<std::string>(),
                      .expiration_time = j["expiration_time"].get<double>(),
                      .signal = j["signal"].get<int>()};
}

void TimerTable::apply(const TimerRequest& r) {
  auto key = std::make_pair(r.pid, r.scope_id);
  if (r.expiration_time < 0) {
    timers_.erase(key);
  } else {
    timers_[key] = r;
  }
}

std::vector<TimerRequest> TimerTable::take_expired(double now) {
  std::map<pid_t, TimerRequest> chosen;
  for (const auto& [key, t] : timers_) {
    if (t.expiration_time > now) continue;
    auto it = chosen.find(t.pid);
    // Prefer a timer with a signal; among equals, the earliest expiration.
    auto better = [&](const TimerRequest& a, const TimerRequest& b) {
      if ((a.signal > 0) != (b.signal > 0)) return a.signal > 0;
      return a.expiration_time < b.expiration_time;
    };
    if (it == chosen.end() || better(t, it->second)) chosen[t.pid] = t;
  }
  std::vector<TimerRequest> out;
  for (auto& [pid, t] : chosen) {
    std::erase_if(timers_, [pid = pid](const auto& entry) { return entry.first.first == pid; });
    out.push_back(std::move(t));
  }
  return out;
}

std::optional<double> TimerTable::next_expiration() const {
  std::optional<double> next;
  for (const auto& [key, t] : timers_) {
    if (!next || t.expiration_time < *next) next = t.expiration_time;
  }
  return next;
}

class FileTimerServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, std::filesystem::path path, ExpiredFn on_expired)
      : path_(std::move(path)), pipe_(io), timer_(io), on_expired_(std::move(on_expired)) {
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && !S_ISFIFO(st.st_mode)) {
      throw std::system_error(EEXIST, std::generic_category(), path_.string() + " exists and is not a FIFO");
    }
    if (::mkfifo(path_.c_str(), 0666) != 0 && errno != EEXIST) {
      throw std::system_error(errno, std::generic_category(),
                              "cannot create the timer FIFO " + path_.string());
    }
    // Read and write: the pipe never reaches end of file when the last client closes it.
    int fd = ::open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
      throw std::system_error(errno, std::generic_category(), "cannot open the timer FIFO " + path_.string());
    pipe_.assign(fd);
  }

  void start() { read(); }
  void stop() {
    boost::system::error_code ignored;
    pipe_.close(ignored);
    timer_.cancel();
    ::unlink(path_.c_str());
  }

  const std::filesystem::path path_;
  std::atomic<uint64_t> requests_{0};

 private:
  void read() {
    pipe_.async_read_some(asio::buffer(chunk_), [self = shared_from_this()](auto ec, size_t n) {
      if (ec) return;  // closed
      self->consume(std::string_view(self->chunk_.data(), n));
      self->read();
    });
  }

  void consume(std::string_view bytes) {
    pending_.append(bytes);
    for (size_t nl; (nl = pending_.find('\n')) != std::string::npos; pending_.erase(0, nl + 1)) {
      std::string error;
      if (auto r = parse_timer_request(std::string_view(pending_).substr(0, nl), error)) {
        ++requests_;
        table_.apply(*r);
      } else {
        spdlog::warn("timer file {}: ignoring a request ({}): {}", path_.string(), error,
                     pending_.substr(0, nl));
      }
    }
    if (pending_.size() > 65536) pending_.clear();  // no client writes lines that long (PIPE_BUF)
    arm();
  }

  void arm() {
    auto next = table_.next_expiration();
    if (!next) return;
    using namespace std::chrono;
    const double now = duration<double>(system_clock::now().time_since_epoch()).count();
    timer_.expires_after(duration_cast<steady_clock::duration>(duration<double>(std::max(0.0, *next - now))));
    timer_.async_wait([self = shared_from_this()](auto ec) {
      if (ec) return;
      const double t = duration<double>(system_clock::now().time_since_epoch()).count();
      for (const auto& r : self->table_.take_expired(t)) self->on_expired_(r);
      self->arm();
    });
  }

  asio::posix::stream_descriptor pipe_;
  asio::steady_timer timer_;
  ExpiredFn on_expired_;
  std::array<char, 4096> chunk_{};
  std::string pending_;
  TimerTable table_;
};

FileTimerServer::FileTimerServer(asio::io_context& io, std::filesystem::path path, ExpiredFn on_expired)
    : impl_(std::make_shared<Impl>(io, std::move(path), std::move(on_expired))) {
  impl_->start();
}

FileTimerServer::~FileTimerServer() {
  impl_->stop();
}

const std::filesystem::path& FileTimerServer::path() const {
  return impl_->path_;
}

uint64_t FileTimerServer::requests() const {
  return impl_->requests_;
}

}  // namespace ddprun::agent
