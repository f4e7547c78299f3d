#include "agent/process/output_pump.h"

#include <limits.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

namespace ddprun::agent {

namespace asio = boost::asio;

namespace {

constexpr size_t kMaxLine = 64 * 1024;        // console lines are cut after this many bytes
constexpr size_t kReadChunk = 64 * 1024;      // one read() from a worker's pipe
constexpr size_t kReadPerTurn = 1024 * 1024;  // then let other handlers run

// Writes all of [data, data+size) to fd; waits when fd is non-blocking and full. False on a write error.
bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (!(n < 0 && errno == EINTR)) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool line_matches(std::string_view line, const std::vector<std::string>& filters) {
  return std::any_of(filters.begin(), filters.end(),
                     [&](const std::string& needle) { return line.find(needle) != std::string_view::npos; });
}

OutputPump::OutputPump(asio::io_context& io, UniqueFd pipe, int console_fd, std::string prefix, UniqueFd file,
                       DuplicateFilter duplicate)
    : pipe_(io, pipe.release()),
      console_fd_(console_fd),
      prefix_(std::move(prefix)),
      file_(std::move(file)),
      duplicate_(std::move(duplicate)) {
  pipe_.non_blocking(true);
}

void OutputPump::start() {
  arm();
}

void OutputPump::drain_available() {
  if (finished_) return;
  int available = 0;
  if (::ioctl(pipe_.native_handle(), FIONREAD, &available) != 0) available = 0;
  size_t left = static_cast<size_t>(available);
  while (left > 0 && !finished_) {
    if (!read_once(std::min(left, kReadChunk), &left)) return;
  }
  if (!finished_) read_once(kReadChunk, nullptr);  // end of file already? (or new bytes: fine, in order)
}

void OutputPump::close() {
  drain_available();
  finish();
}

void OutputPump::arm() {
  pipe_.async_wait(asio::posix::descriptor_base::wait_read, [self = shared_from_this()](auto ec) {
    if (!ec) self->on_readable();
  });
}

void OutputPump::on_readable() {
  // Edge-triggered readiness: read until EAGAIN before waiting again, or yield and come back.
  size_t budget = kReadPerTurn;
  while (!finished_) {
    if (budget == 0) {
      asio::post(pipe_.get_executor(), [self = shared_from_this()] { self->on_readable(); });
      return;
    }
    if (!read_once(std::min(budget, kReadChunk), &budget)) break;  // EAGAIN or end of file
  }
  if (!finished_) arm();
}

bool OutputPump::read_once(size_t max, size_t* left) {
  char buf[kReadChunk];
  for (;;) {
    const ssize_t n = ::read(pipe_.native_handle(), buf, std::min(max, sizeof buf));
    if (n > 0) {
      consume(buf, static_cast<size_t>(n));
      if (left) *left -= std::min(*left, static_cast<size_t>(n));
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (!(n < 0 && errno == EAGAIN)) finish();
    return false;
  }
}

void OutputPump::consume(const char* data, size_t size) {
  if (file_.get() >= 0 && !write_all(file_.get(), data, size)) {
    spdlog::warn("cannot write a worker's log file: {}; its output is not saved from now on",
                 strerror(errno));
    file_.reset();
  }
  if (console_fd_ < 0) return;
  pending_.append(data, size);
  emit_lines(false);
}

void OutputPump::emit_lines(bool at_eof) {
  std::string batch, duplicates;
  size_t pos = 0;
  auto add = [&](size_t len, bool add_newline, bool complete) {
    const size_t piece = prefix_.size() + len + (add_newline ? 1 : 0);
    if (!batch.empty() && batch.size() + piece > PIPE_BUF) flush(batch);
    // The '\n' of a "\r\n" split across reads ends the line the '\r' already showed: no second prefix.
    const bool newline_after_cr = after_cr_ && len == 1 && pending_[pos] == '\n';
    if (!newline_after_cr && !mid_line_) batch += prefix_;
    const std::string_view text(pending_.data() + pos, len);
    if (!complete) {
      line_shown_ += text;  // the line goes on: the duplicate filter judges it whole, later
    } else if (!newline_after_cr && duplicate_.active()) {
      add_duplicate(line_shown_.empty() ? std::string(text) : line_shown_ + std::string(text), duplicates);
    }
    if (complete) line_shown_.clear();
    batch += text;
    if (add_newline) batch += '\n';
    after_cr_ = complete && !add_newline && text.back() == '\r';
    mid_line_ = !complete;
    pos += len;
  };
  while (pos < pending_.size()) {
    // A line ends at '\n', or at a '\r' not followed by '\n': a progress bar redrawing itself (tqdm) is
    // shown as it goes, each redraw with the prefix.
    size_t end = pending_.find_first_of("\r\n", pos);
    if (end != std::string::npos && pending_[end] == '\r' && end + 1 < pending_.size() &&
        pending_[end + 1] == '\n') {
      ++end;
    }
    if (end != std::string::npos && end - pos <= kMaxLine) {
      add(end + 1 - pos, false, true);
    } else if (pending_.size() - pos > kMaxLine) {
      add(kMaxLine, true, true);
    } else if (at_eof) {
      add(pending_.size() - pos, true, true);
    } else if (after_cr_ || mid_line_) {
      // A redraw after a '\r' (tqdm writes "\r" + the bar, and nothing until the next update): shown now,
      // not when the next update ends it, so the console is never one update behind.
      add(pending_.size() - pos, false, false);
    } else {
      break;
    }
  }
  if (at_eof && mid_line_) {  // the stream ended in the middle of a redrawn line
    batch += '\n';
    mid_line_ = false;
    line_shown_.clear();
  }
  flush(batch);
  flush_duplicates(duplicates);
  pending_.erase(0, pos);
}

void OutputPump::flush(std::string& batch) {
  if (!batch.empty()) write_all(console_fd_, batch.data(), batch.size());  // console errors: dropped
  batch.clear();
}

void OutputPump::add_duplicate(std::string_view text, std::string& batch) const {
  bool ended = false;  // torch reads the stream in text mode: "\r\n", "\r" and "\n" all end as "\n"
  if (text.ends_with("\r\n")) {
    text.remove_suffix(2);
    ended = true;
  } else if (text.ends_with('\n') || text.ends_with('\r')) {
    text.remove_suffix(1);
    ended = true;
  }
  std::string line(text);
  if (ended) line += '\n';
  if (!line_matches(line, duplicate_.filters)) return;
  if (!line.ends_with('\n')) line += '\n';  // a line cut at 64 KiB, or the last one of the stream
  if (!batch.empty() && batch.size() + duplicate_.prefix.size() + line.size() > PIPE_BUF)
    flush_duplicates(batch);
  batch += duplicate_.prefix;
  batch += line;
}

void OutputPump::flush_duplicates(std::string& batch) const {
  // One write() per batch to the shared O_APPEND file; an error loses these lines only.
  if (!batch.empty() && !write_all(duplicate_.file->get(), batch.data(), batch.size())) {
    spdlog::debug("cannot write a filtered log: {}", strerror(errno));
  }
  batch.clear();
}

void OutputPump::finish() {
  if (finished_) return;
  finished_ = true;
  if (console_fd_ >= 0 && (!pending_.empty() || mid_line_)) emit_lines(true);
  file_.reset();
  boost::system::error_code ignored;
  pipe_.close(ignored);
}

}  // namespace ddprun::agent
