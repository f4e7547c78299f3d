// ddprun-store-init-storm: N simulated ranks doing, against one TCPStore server, what init_process_group does
// with it, all at once: the store's side of a job's start at scale (scripts/bench-store-scale.sh).
//
//   ddprun-store-init-storm --port P --ranks N [--host H] [--dialect legacy|modern] [--server-pid PID]
//                           [--connect-concurrency C] [--timeout S] [--label NAME]
//
// Each rank, on one connection, one request at a time (as torch's client: it waits for every reply):
//   1. connects (at most --connect-concurrency connects in flight over all ranks, as many hosts would);
//   2. modern dialect (torch 2.x): VALIDATE with the magic number (no reply);
//   3. ADD "init/<run>/count" 1 (reply: the new count); the rank that brings it to N SETs "init/<run>/done"
//      (no reply); <run> is this process's pid and start time, so runs against one server never meet;
//   4. WAIT ".../done" (reply: STOP_WAITING once the last rank has arrived): the barrier;
//   5. GET ".../done" (reply: the value), then keeps its connection open until every rank is done.
// One thread, one boost::asio::io_context; RLIMIT_NOFILE raised to the hard limit first.
//
// Output: one JSON line: label, dialect, ranks, done (ranks that finished), total_s (first connect to the
// last GET reply), connected_s (the last connect done), barrier_s (the last ADD reply), server_cpu_s (user +
// system of --server-pid over the run, -1 unknown), server_hwm_kb (VmHWM after the run), errors, first_error.
// Exit codes: 0 every rank finished; 1 errors or the timeout; 2 bad flags or an unresolvable host.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
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

namespace ddprun::bench {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  size_t ranks = 1000;
  std::string dialect = "modern";
  int server_pid = 0;
  size_t connect_concurrency = 1024;
  double timeout_s = 300;
  std::string label;
};

// User + system CPU seconds of a process (all threads), from /proc/PID/stat; nullopt when unreadable.
std::optional<double> cpu_seconds(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');
  if (pid <= 0 || close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int64_t hwm_kb(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

class Storm;

// One simulated rank: its connection and where it is in the sequence above.
struct Rank {
  enum class Step { kConnect, kAdd, kWait, kGet, kDone };
  Rank(asio::io_context& io, size_t index) : socket(io), index(index) {}
  tcp::socket socket;
  size_t index;
  Step step = Step::kConnect;
  std::vector<uint8_t> in = std::vector<uint8_t>(256);
  size_t have = 0;
};

class Storm {
 public:
  explicit Storm(Options o) : o_(std::move(o)), dialect_(*rdzv::parse_dialect(o_.dialect)) {
    tcp::resolver resolver(io_);
    endpoint_ = resolver.resolve(o_.host, std::to_string(o_.port)).begin()->endpoint();
  }

  int run() {
    for (size_t i = 0; i < o_.ranks; ++i) ranks_.push_back(std::make_unique<Rank>(io_, i));
    const auto cpu0 = cpu_seconds(o_.server_pid);
    start_ = Clock::now();
    timer_.expires_after(
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.timeout_s)));
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      error("timeout after " + std::to_string(o_.timeout_s) + " s with " + std::to_string(done_) + " of " +
            std::to_string(o_.ranks) + " ranks done");
      io_.stop();
    });
    connect_more();
    io_.run();
    const double total = seconds_since_start(last_done_);
    const auto cpu1 = cpu_seconds(o_.server_pid);
    nlohmann::ordered_json j{{"label", o_.label},
                             {"dialect", o_.dialect},
                             {"ranks", o_.ranks},
                             {"done", done_},
                             {"total_s", done_ == o_.ranks ? total : -1.0},
                             {"connected_s", seconds_since_start(last_connected_)},
                             {"barrier_s", seconds_since_start(last_add_)},
                             {"server_cpu_s", cpu0 && cpu1 ? *cpu1 - *cpu0 : -1.0},
                             {"server_hwm_kb", o_.server_pid > 0 ? hwm_kb(o_.server_pid) : -1},
                             {"errors", errors_},
                             {"first_error", first_error_}};
    std::cout << j.dump() << std::endl;
    return errors_ == 0 && done_ == o_.ranks ? 0 : 1;
  }

 private:
  double seconds_since_start(Clock::time_point t) const {
    return t == Clock::time_point{} ? -1.0 : std::chrono::duration<double>(t - start_).count();
  }

  void error(const std::string& what) {
    if (errors_++ == 0) first_error_ = what;
  }

  void connect_more() {
    while (in_flight_ < o_.connect_concurrency && next_ < ranks_.size()) {
      Rank& r = *ranks_[next_++];
      ++in_flight_;
      r.socket.async_connect(endpoint_, [this, &r](const boost::system::error_code& ec) {
        --in_flight_;
        last_connected_ = Clock::now();
        if (ec) {
          fail(r, "connect: " + ec.message());
        } else {
          r.socket.set_option(tcp::no_delay(true));
          std::string out;
          if (dialect_ == rdzv::Dialect::kModern) {
            encode(out, {.op = rdzv::Op::kValidate, .number = rdzv::kValidationMagic});
          }
          encode(out, {.op = rdzv::Op::kAdd, .keys = {key("count")}, .delta = 1});
          send(r, Rank::Step::kAdd, std::move(out));
        }
        connect_more();
      });
    }
  }

  // A key of this run: "init/<pid>.<start ns>/<name>", so that runs against one server never meet.
  std::string key(const char* name) const { return prefix_ + name; }

  void encode(std::string& out, const rdzv::Request& req) {
    if (!rdzv::encode_request(dialect_, req, out)) throw std::logic_error("op missing from the dialect");
  }

  // Writes `bytes` (a request, possibly preceded by one without reply) and waits for the reply of `step`.
  void send(Rank& r, Rank::Step step, std::string bytes) {
    r.step = step;
    r.have = 0;
    auto buf = std::make_shared<std::string>(std::move(bytes));
    asio::async_write(r.socket, asio::buffer(*buf),
                      [this, &r, buf](const boost::system::error_code& ec, size_t) {
                        if (ec) fail(r, "send: " + ec.message());
                      });
    read(r);
  }

  void read(Rank& r) {
    if (r.in.size() - r.have < 64) r.in.resize(r.in.size() * 2);
    r.socket.async_read_some(asio::buffer(r.in.data() + r.have, r.in.size() - r.have),
                             [this, &r](const boost::system::error_code& ec, size_t n) {
                               if (ec) {
                                 if (r.step != Rank::Step::kDone) fail(r, "receive: " + ec.message());
                                 return;
                               }
                               r.have += n;
                               on_bytes(r);
                             });
  }

  void on_bytes(Rank& r) {
    rdzv::WireReader reader(std::span<const uint8_t>(r.in.data(), r.have));
    switch (r.step) {
      case Rank::Step::kAdd: {
        int64_t count = 0;
        if (!reader.i64(count)) return read(r);
        last_add_ = Clock::now();
        std::string out;
        if (count == static_cast<int64_t>(o_.ranks)) {
          encode(out, {.op = rdzv::Op::kSet, .keys = {key("done")}, .values = {"1"}});
        }
        encode(out, {.op = rdzv::Op::kWait, .keys = {key("done")}});
        return send(r, Rank::Step::kWait, std::move(out));
      }
      case Rank::Step::kWait: {
        uint8_t reply = 0;
        if (!reader.u8(reply)) return read(r);
        if (reply != rdzv::kWaitStopWaiting) return fail(r, "WAIT replied " + std::to_string(reply));
        std::string out;
        encode(out, {.op = rdzv::Op::kGet, .keys = {key("done")}});
        return send(r, Rank::Step::kGet, std::move(out));
      }
      case Rank::Step::kGet: {
        std::string value;
        auto st = reader.bytes(value, 1024);
        if (st == rdzv::WireReader::BytesStatus::kShort) return read(r);
        if (st != rdzv::WireReader::BytesStatus::kOk || value != "1") return fail(r, "GET: a wrong reply");
        r.step = Rank::Step::kDone;
        last_done_ = Clock::now();
        if (++done_ == o_.ranks) {
          timer_.cancel();
          io_.stop();  // every rank done; the connections close when the program exits
        }
        return read(r);  // notices a server that closes the connection early
      }
      default:
        return fail(r, "bytes in an unexpected state");
    }
  }

  void fail(Rank& r, const std::string& what) {
    error("rank " + std::to_string(r.index) + ": " + what);
    r.step = Rank::Step::kDone;
    boost::system::error_code ignored;
    r.socket.close(ignored);
  }

  Options o_;
  rdzv::Dialect dialect_;
  std::string prefix_ = "init/" + std::to_string(getpid()) + "." +
                        std::to_string(Clock::now().time_since_epoch().count()) + "/";
  asio::io_context io_{1};
  asio::steady_timer timer_{io_};
  tcp::endpoint endpoint_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  size_t next_ = 0, in_flight_ = 0, done_ = 0;
  Clock::time_point start_{}, last_connected_{}, last_add_{}, last_done_{};
  uint64_t errors_ = 0;
  std::string first_error_;
};

}  // namespace
}  // namespace ddprun::bench

int main(int argc, char** argv) {
  ddprun::bench::Options o;
  CLI::App app{"N simulated ranks initialising against one TCPStore server"};
  app.add_option("--host", o.host);
  app.add_option("--port", o.port)->required();
  app.add_option("--ranks", o.ranks)->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--dialect", o.dialect)->check(CLI::IsMember({"legacy", "modern"}));
  app.add_option("--server-pid", o.server_pid);
  app.add_option("--connect-concurrency", o.connect_concurrency)
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--timeout", o.timeout_s)->check(CLI::PositiveNumber);
  app.add_option("--label", o.label);
  CLI11_PARSE(app, argc, argv);
  ddprun::bench::raise_fd_limit();
  try {
    return ddprun::bench::Storm(o).run();
  } catch (const std::exception& e) {
    std::cerr << "ddprun-store-init-storm: " << e.what() << "\n";
    return 2;
  }
}
