// StoreClient::Connection (store_client.h): one TCP connection of a StoreClient, with deadline-bounded reads
// and writes. Private to store_client.cc and store_client_auth.cc. Not thread-safe: the StoreClient's mutex
// guards it.
#pragma once

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr auto kConnectWarningInterval = std::chrono::seconds(10);

// One TCP connection with buffered, deadline-bounded reads and writes (Asio's "blocking client with
// timeouts" pattern: start an async operation, run the private io_context until the deadline).
class StoreClient::Connection {
 public:
  Connection(const std::string& host, uint16_t port, const std::string& endpoint,
             std::chrono::steady_clock::time_point deadline)
      : endpoint_(endpoint), socket_(io_) {
    auto backoff = std::chrono::milliseconds(50);
    std::string last_error = "no attempt made";
    tcp::resolver resolver(io_);
    // Retrying is silent for a while (the head node may still be starting), then said every 10 s; a name that
    // does not resolve is said at once (most likely a typo).
    auto next_warning = std::chrono::steady_clock::now() + kConnectWarningInterval;
    for (bool first = true;; first = false) {
      boost::system::error_code ec;
      auto results = resolver.resolve(host, std::to_string(port), ec);
      if (ec) {
        last_error = "cannot resolve '" + host + "': " + ec.message();
        if (first) next_warning = std::chrono::steady_clock::now();
      } else {
        bool done = false;
        asio::async_connect(socket_, results, [&](const boost::system::error_code& e, const tcp::endpoint&) {
          ec = e;
          done = true;
        });
        run_until(done, ec, deadline);
        if (!done) {
          last_error = "connect timed out";
        } else if (!ec) {
          socket_.set_option(tcp::no_delay(true), ec);
          return;
        } else {
          last_error = ec.message();
        }
      }
      auto now = std::chrono::steady_clock::now();
      if (now + backoff >= deadline) break;
      if (now >= next_warning) {
        spdlog::warn("cannot reach the store at {} yet: {}; retrying for {} s more", endpoint_, last_error,
                     std::chrono::duration_cast<std::chrono::seconds>(deadline - now).count());
        next_warning = now + kConnectWarningInterval;
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    throw TimeoutError("cannot connect to the store at " + endpoint_ + ": " + last_error +
                       " (is the store or the head node's agent running, and is the address right?)");
  }

  void write(const std::string& bytes, std::chrono::steady_clock::time_point deadline,
             std::string_view what) {
    boost::system::error_code ec;
    bool done = false;
    asio::async_write(socket_, asio::buffer(bytes), [&](const boost::system::error_code& e, size_t) {
      ec = e;
      done = true;
    });
    run_until(done, ec, deadline);
    if (!done) {
      broken_ = true;
      throw TimeoutError(std::string(what) + ": sending to the store at " + endpoint_ + " timed out");
    }
    if (ec) fail(what, ec);
  }

  // Waits until at least one byte can be read. Returns false at the deadline, leaving the connection usable.
  bool wait_readable(std::chrono::steady_clock::time_point deadline, std::string_view what) {
    if (end_ > start_) return true;
    return fill(deadline, what, /*may_time_out=*/true);
  }

  void read(void* dst, size_t n, std::chrono::steady_clock::time_point deadline, std::string_view what) {
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (end_ == start_) {
        if (!fill(deadline, what, false)) {
          broken_ = true;
          throw TimeoutError(std::string(what) + ": no reply from the store at " + endpoint_ + " in time");
        }
      }
      size_t take = std::min(n, end_ - start_);
      std::memcpy(out, buf_.data() + start_, take);
      start_ += take;
      out += take;
      n -= take;
    }
  }

  template <typename T>
  T read_value(std::chrono::steady_clock::time_point deadline, std::string_view what) {
    T v{};
    read(&v, sizeof v, deadline, what);
    return v;
  }

  std::string read_bytes(size_t max, std::chrono::steady_clock::time_point deadline, std::string_view what) {
    auto len = read_value<uint64_t>(deadline, what);
    if (len > max) {
      broken_ = true;
      throw BadReplyError(std::string(what) + ": the store at " + endpoint_ + " announced a " +
                          std::to_string(len) + "-byte value, over the limit of " + std::to_string(max));
    }
    std::string s(len, '\0');
    read(s.data(), len, deadline, what);
    return s;
  }

  bool broken() const { return broken_; }
  void mark_broken() { broken_ = true; }

 private:
  // Reads more bytes into the buffer. Returns false on deadline.
  bool fill(std::chrono::steady_clock::time_point deadline, std::string_view what, bool may_time_out) {
    if (start_ == end_) start_ = end_ = 0;
    if (buf_.size() - end_ < 4096) {
      if (start_ > 0) {
        std::memmove(buf_.data(), buf_.data() + start_, end_ - start_);
        end_ -= start_;
        start_ = 0;
      }
      if (buf_.size() - end_ < 4096) buf_.resize(std::max<size_t>(buf_.size() * 2, 64 * 1024));
    }
    boost::system::error_code ec;
    size_t n = 0;
    bool done = false;
    socket_.async_read_some(asio::buffer(buf_.data() + end_, buf_.size() - end_),
                            [&](const boost::system::error_code& e, size_t got) {
                              ec = e;
                              n = got;
                              done = true;
                            });
    run_until(done, ec, deadline);
    if (!done) {
      (void)may_time_out;
      return false;
    }
    if (ec) fail(what, ec);
    end_ += n;
    return true;
  }

  // Runs the io_context until `done` or the deadline; on the deadline cancels the operation and waits for
  // its handler, so nothing refers to stack variables afterwards. `done` is false afterwards when the
  // deadline passed (the handler then ran with operation_aborted, which is not a lost connection).
  void run_until(bool& done, const boost::system::error_code& ec,
                 std::chrono::steady_clock::time_point deadline) {
    io_.restart();
    io_.run_until(deadline);
    if (!done) {
      boost::system::error_code ignored;
      socket_.cancel(ignored);
      io_.restart();
      io_.run();
      // The operation may have completed just before the cancel took effect.
      if (ec == asio::error::operation_aborted) done = false;
    }
  }

  [[noreturn]] void fail(std::string_view what, const boost::system::error_code& ec) {
    broken_ = true;
    throw ConnectionLostError(
        std::string(what) + ": lost the connection to the store at " + endpoint_ + ": " + ec.message() +
        (ec == asio::error::eof ? " (closed by the store: it stopped, or it admits only the job's "
                                  "authenticated agents and this one lacks the job's secret, "
                                  "--rdzv_secret_file, or MUNGE, docs/security.md)"
                                : ""));
  }

  std::string endpoint_;
  asio::io_context io_;
  tcp::socket socket_;
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(64 * 1024);
  size_t start_ = 0;
  size_t end_ = 0;
  bool broken_ = false;
};

}  // namespace ddprun::rdzv
