// The two parts of ddprun-store-bench (store_load.cc, which documents what it does): Client, one connection
// with at most one request outstanding (store_load_client.cc), and Bench, the phases and the report.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20
#include <vector>

#include "rendezvous/store/wire_codec.h"
#include "scripts/bench/fd_limit.h"
#include "scripts/bench/proc_sample.h"

namespace ddprun::bench::store_load {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

constexpr double kPrepareTimeoutS = 30;  // pre-setting keys, finishing the requests in flight
constexpr double kIdleCheckTimeoutS = 60;

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  size_t clients = 1;
  std::string op = "get";
  double seconds = 3.0;
  double warmup = 0.5;
  size_t value_bytes = 64;
  size_t idle = 0;
  size_t connect_concurrency = 256;
  double connect_timeout_s = 60.0;
  int server_pid = 0;
  std::string label;
};

inline rdzv::Request make(rdzv::Op op, std::string key = {}, std::optional<std::string> value = {},
                          int64_t delta = 0) {
  rdzv::Request r;
  r.op = op;
  if (!key.empty()) r.keys.push_back(std::move(key));
  if (value) r.values.push_back(std::move(*value));
  r.delta = delta;
  return r;
}

inline std::string encode(std::initializer_list<rdzv::Request> requests) {
  std::string out;
  for (const auto& r : requests) {
    if (!rdzv::encode_request(rdzv::Dialect::kLegacy, r, out)) {
      throw std::logic_error("op missing from the legacy dialect: " + std::string(rdzv::op_name(r.op)));
    }
  }
  return out;
}

// The reply a request expects: an i64 (ADD, GETNUMKEYS) or a byte vector (GET).
enum class ReplyKind { kInt, kBytes };

class Bench;

// One connection with at most one request outstanding. Owned by Bench; handlers capture `this`, which is
// safe because clients outlive every run of the io_context.
class Client {
 public:
  Client(Bench& bench, tcp::socket socket, size_t index)
      : bench_(bench), socket_(std::move(socket)), index_(index), in_(4096) {}

  // Sends `request` (it must stay alive until the reply) and waits for one reply of `kind`. The result
  // goes to Bench::on_reply or Bench::on_failure.
  void issue(const std::string& request, ReplyKind kind);
  void close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  size_t index() const { return index_; }
  Clock::time_point sent_at() const { return sent_at_; }
  int64_t int_reply() const { return int_reply_; }
  const std::string& bytes_reply() const { return bytes_reply_; }

  // The measured op's requests, issued in turn (one for set, get and add; SET, GET, ADD for mix).
  struct Step {
    std::string request;
    ReplyKind kind;
    char op;  // 's' SET + GETNUMKEYS, 'g' GET, 'a' ADD
  };
  std::vector<Step> steps;
  size_t step = 0;                  // the step in flight
  std::optional<int64_t> last_add;  // the previous ADD reply
  void issue_step() { issue(steps[step].request, steps[step].kind); }

 private:
  void wait_reply();
  void on_readable(const boost::system::error_code& ec);

  Bench& bench_;
  tcp::socket socket_;
  size_t index_;
  std::vector<uint8_t> in_;
  size_t have_ = 0;
  ReplyKind kind_ = ReplyKind::kInt;
  Clock::time_point sent_at_{};
  int64_t int_reply_ = 0;
  std::string bytes_reply_;
  std::string write_error_;  // why the rest of a request could not be sent
};

class Bench {
 public:
  explicit Bench(Options o);  // throws boost::system::system_error when the host does not resolve
  // Runs every phase and prints the JSON line; returns the exit code.
  int run();

  void on_reply(Client& c);
  void on_failure(Client& c, const std::string& what);

 private:
  enum class Phase { kConnectIdle, kConnectActive, kPrepare, kRun, kIdleCheck, kDone };
  using Sockets = std::vector<std::unique_ptr<tcp::socket>>;

  // Opens `count` connections, at most connect_concurrency at a time, then calls `done` with them
  // (nullptr where one failed or was still connecting at the deadline).
  void connect_many(size_t count, std::function<void(Sockets)> done);
  void arm_deadline(double seconds, std::function<void()> on_expiry);
  void start_prepare();
  void start_run();
  void client_done();  // a client sends nothing more in this phase
  void start_idle_check();
  void finish();
  void error(const std::string& what) {
    if (errors_++ == 0) first_error_ = what;
  }
  std::string check_reply(Client& c);  // empty when the reply is right
  nlohmann::ordered_json report() const;

  Options o_;
  asio::io_context io_{1};
  tcp::endpoint endpoint_;
  asio::steady_timer deadline_{io_};
  asio::steady_timer start_timer_{io_};
  asio::steady_timer measure_timer_{io_};
  Phase phase_ = Phase::kConnectIdle;

  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::unique_ptr<Client>> idle_;
  size_t outstanding_ = 0;  // clients the current phase still waits for
  std::vector<std::string> prepare_requests_;
  std::string ping_request_;

  bool stopping_ = false;
  Clock::time_point measure_start_{};
  Clock::time_point measure_end_{};
  std::vector<uint32_t> latencies_ns_;
  uint64_t errors_ = 0;
  std::string first_error_;
  size_t idle_connected_ = 0;
  size_t idle_alive_ = 0;
  ServerSample before_;
  ServerSample after_;
  std::optional<CpuTimes> cpu_start_;
  std::optional<CpuTimes> cpu_end_;
};

}  // namespace ddprun::bench::store_load
