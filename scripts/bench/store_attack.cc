// ddprun-store-attack: one of two hostile-reader attacks on a TCPStore server, measuring what it costs the
// server's memory and a fresh client meanwhile. Legacy dialect (torch 1.13 numbering): the same binary drives
// ddprun-store of any version and torch 1.13's server.
//
//   ddprun-store-attack --port N --server-pid PID --attack watch|get [--clients N] [--value-bytes B]
//                       [--sets N] [--hold S] [--label NAME]
//
// The attacks (every attacking connection has a 4 KiB receive buffer and a 1448-byte segment size, as over
// Ethernet):
//   watch  --clients (default 100) connections each WATCH_KEY "/attack/w" (torch 1.13's callback
//          connection) and never read past the acknowledgement; then one client SETs the key --sets times
//          (default 5) to distinct values of --value-bytes (default 2 MiB), each SET acknowledged by a
//          GETNUMKEYS reply. Every SET notifies every watcher with the old and the new value.
//   get    one client SETs "/attack/blob" to --value-bytes (default 8 MiB); then --clients (default 1000)
//          connections each send one GET of it and read the reply slowly: every 100 ms, at most 4 KiB each
//          (a broadcast of a large blob to every rank, with ranks that are busy).
// From the first attacking request to --hold seconds (default 5) after the last, the server's VmRSS is
// sampled every 50 ms, and a fresh client probes the server again and again: connect, ADD "/attack/probe"
// 1, read the reply; its round trip is the time from the connect to the reply (at most one probe at a time,
// the next 100 ms after the last one ended; a probe that takes over 30 s counts as 30 s and ends the run).
//
// Prints one JSON line: label, attack, clients, value_bytes, sets, hold_s, rss_before_kb (before the attack),
// rss_peak_kb (the highest sample), rss_growth_mib (peak - before), hwm_growth_mib (VmHWM at the end -
// before: the kernel's own peak, when the server started fresh for this run), probes, probe_p50_ms,
// probe_max_ms, attack_s (from the first attacking request to the end), server_cpu_s (the server's CPU time
// in it), probe_unanswered_ms (the probe still unanswered when the attack ended: how long it had
// waited; 0: none), attackers_dropped (attacking connections the server closed), errors, first_error. Exit
// codes: 0 done, 1 errors (the JSON line is still printed), 2 bad flags.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20
#include <vector>

#include "rendezvous/store/wire_codec.h"
#include "scripts/bench/fd_limit.h"
#include "scripts/bench/proc_sample.h"

namespace ddprun::bench {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kProbeCap = 30s;
constexpr size_t kSlowRead = 4096;
constexpr int kAttackerMss = 1448;

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int server_pid = 0;
  std::string attack = "watch";
  size_t clients = 0;      // 0: the attack's default
  size_t value_bytes = 0;  // 0: the attack's default
  int sets = 5;
  double hold_s = 5;
  std::string label;
};

std::string encode(const rdzv::Request& r) {
  std::string out;
  rdzv::encode_request(rdzv::Dialect::kLegacy, r, out);
  return out;
}

class Attack {
 public:
  explicit Attack(Options o) : o_(std::move(o)) {
    tcp::resolver resolver(io_);
    endpoint_ = resolver.resolve(o_.host, std::to_string(o_.port)).begin()->endpoint();
  }

  int run() {
    before_ = sample_server(o_.server_pid);
    peak_kb_ = before_.rss_kb;
    try {
      o_.attack == "watch" ? watch() : get();
    } catch (const boost::system::system_error& e) {
      error(std::string("setting up the attack: ") + e.what());
    }
    std::cout << report().dump() << std::endl;
    return errors_ == 0 ? 0 : 1;
  }

 private:
  // A blocking connection for the attack's own set-up and writes.
  // Its blocking reads give up after 30 s (SO_RCVTIMEO).
  tcp::socket connect(bool slow_reader) {
    tcp::socket s(io_);
    s.open(endpoint_.protocol());
    if (slow_reader) {
      s.set_option(asio::socket_base::receive_buffer_size(static_cast<int>(kSlowRead)));
      // Ethernet's segment size: with loopback's 64 KiB segments the kernel gives the server's side of each
      // connection a send buffer of ~2.5 MiB (1000 attackers: 2.5 GB of kernel memory, past tcp_mem's
      // pressure mark, which slows every socket of the machine).
      const int mss = kAttackerMss;
      ::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof mss);
    }
    s.connect(endpoint_);
    s.set_option(tcp::no_delay(true));
    timeval limit{.tv_sec = 30, .tv_usec = 0};
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    return s;
  }

  // SET key value, acknowledged by the GETNUMKEYS reply after it.
  void set(tcp::socket& s, const std::string& key, std::string value) {
    asio::write(s, asio::buffer(encode({.op = rdzv::Op::kSet, .keys = {key}, .values = {std::move(value)}}) +
                                encode({.op = rdzv::Op::kGetNumKeys})));
    std::array<char, 8> reply{};
    asio::read(s, asio::buffer(reply));
  }

  void watch() {
    const size_t n = o_.clients ? o_.clients : 100, bytes = value_bytes();
    for (size_t i = 0; i < n; ++i) {
      attackers_.push_back(std::make_unique<tcp::socket>(connect(true)));
      asio::write(*attackers_.back(),
                  asio::buffer(encode({.op = rdzv::Op::kWatchKey, .keys = {"/attack/w"}})));
      std::array<char, 1> ack{};
      asio::read(*attackers_.back(), asio::buffer(ack));
    }
    tcp::socket setter = connect(false);
    start_sampling();
    // The SETs run on a thread of their own (blocking), while this one samples and probes.
    std::thread writer([&] {
      try {
        for (int i = 0; i < o_.sets; ++i)
          set(setter, "/attack/w", std::string(bytes, static_cast<char>('a' + i)));
      } catch (const boost::system::system_error& e) {
        asio::post(io_, [this, what = std::string(e.what())] { error("SET: " + what); });
      }
      asio::post(io_, [this] { hold(); });
    });
    io_.run();
    writer.join();
  }

  void get() {
    const size_t n = o_.clients ? o_.clients : 1000, bytes = value_bytes();
    {
      tcp::socket setter = connect(false);
      set(setter, "/attack/blob", std::string(bytes, 'b'));
    }
    reply_bytes_ = bytes + 8;
    for (size_t i = 0; i < n; ++i) attackers_.push_back(std::make_unique<tcp::socket>(connect(true)));
    start_sampling();
    const std::string get = encode({.op = rdzv::Op::kGet, .keys = {"/attack/blob"}});
    for (auto& s : attackers_) {
      asio::write(*s, asio::buffer(get));
      s->non_blocking(true);
    }
    received_.assign(attackers_.size(), 0);
    read_slowly();
    hold();
    io_.run();
  }

  // Every 100 ms, each GET client reads what is there, up to 4 KiB; a client done or dropped stops.
  void read_slowly() {
    std::array<char, kSlowRead> buf{};
    for (size_t i = 0; i < attackers_.size(); ++i) {
      auto& s = *attackers_[i];
      if (!s.is_open() || received_[i] >= reply_bytes_) continue;
      boost::system::error_code ec;
      size_t got = s.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
      if (ec || got == 0) {
        ++dropped_;
        s.close(ec);
        continue;
      }
      received_[i] += got;
    }
    read_timer_.expires_after(100ms);
    read_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) read_slowly();
    });
  }

  size_t value_bytes() const {
    if (o_.value_bytes) return o_.value_bytes;
    return o_.attack == "watch" ? size_t{2} << 20 : size_t{8} << 20;
  }

  void start_sampling() {
    attack_started_ = Clock::now();
    cpu_before_ = sample_cpu(o_.server_pid).server_s;
    sample();
    probe();
  }

  void sample() {
    peak_kb_ = std::max(peak_kb_, sample_server(o_.server_pid).rss_kb);
    sample_timer_.expires_after(50ms);
    sample_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) sample();
    });
  }

  // The attack's last request is sent: go on sampling and probing for --hold seconds, then stop.
  void hold() {
    end_timer_.expires_after(
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.hold_s)));
    end_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) stop();
    });
  }

  void stop() {
    if (stopped_) return;
    stopped_ = true;
    if (probe_started_) {  // still unanswered when the attack ends: how long it had waited so far
      unanswered_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - *probe_started_).count();
    }
    after_ = sample_server(o_.server_pid);
    attack_s_ = std::chrono::duration<double>(Clock::now() - attack_started_).count();
    server_cpu_s_ = sample_cpu(o_.server_pid).server_s - cpu_before_;
    peak_kb_ = std::max(peak_kb_, after_.rss_kb);
    if (o_.attack == "watch") {
      // A watcher the server dropped reads what was sent before the close, then end of file; one still held
      // has more than the server's send buffer (4 MiB at most) queued for it: read up to 8 MiB.
      for (auto& s : attackers_) {
        s->non_blocking(true);
        std::array<char, 65536> b{};
        boost::system::error_code ec;
        for (size_t read = 0; read < (size_t{8} << 20);) {
          size_t got = s->read_some(asio::buffer(b), ec);
          if (ec) break;
          read += got;
        }
        if (ec == asio::error::eof || ec == asio::error::connection_reset) ++dropped_;
      }
    }
    sample_timer_.cancel();
    read_timer_.cancel();
    probe_timer_.cancel();
    io_.stop();
  }

  // One fresh client: connect, ADD, read the i64; then the next one 100 ms later.
  void probe() {
    if (stopped_) return;
    auto s = std::make_shared<tcp::socket>(io_);
    auto started = std::make_shared<Clock::time_point>(Clock::now());
    probe_started_ = *started;
    auto reply = std::make_shared<std::array<char, 8>>();
    probe_timer_.expires_after(kProbeCap);
    probe_timer_.async_wait([this, s](const boost::system::error_code& ec) {
      if (ec) return;
      error("a probe took over 30 s");
      probes_ms_.push_back(std::chrono::duration<double, std::milli>(kProbeCap).count());
      s->close();
      stop();
    });
    s->async_connect(endpoint_, [this, s, started, reply](const boost::system::error_code& ec) {
      if (ec) return probe_failed("connect: " + ec.message());
      s->set_option(tcp::no_delay(true));
      auto req = std::make_shared<std::string>(
          encode({.op = rdzv::Op::kAdd, .keys = {"/attack/probe"}, .delta = 1}));
      asio::async_write(
          *s, asio::buffer(*req),
          [this, s, req, started, reply](const boost::system::error_code& wec, size_t) {
            if (wec) return probe_failed("send: " + wec.message());
            asio::async_read(
                *s, asio::buffer(*reply), [this, s, started](const boost::system::error_code& rec, size_t) {
                  if (rec) return probe_failed("receive: " + rec.message());
                  probes_ms_.push_back(
                      std::chrono::duration<double, std::milli>(Clock::now() - *started).count());
                  probe_started_.reset();
                  probe_timer_.cancel();
                  s->close();
                  next_probe();
                });
          });
    });
  }
  void probe_failed(const std::string& what) {
    if (stopped_) return;
    probe_started_.reset();
    probe_timer_.cancel();
    error("probe " + what);
    next_probe();
  }
  void next_probe() {
    probe_timer_.expires_after(100ms);
    probe_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) probe();
    });
  }

  void error(const std::string& what) {
    if (errors_++ == 0) first_error_ = what;
  }

  nlohmann::ordered_json report() const {
    auto ms = probes_ms_;
    std::sort(ms.begin(), ms.end());
    auto round1 = [](double v) { return std::round(v * 10) / 10; };
    const double mib = 1024;
    nlohmann::ordered_json j;
    j["label"] = o_.label;
    j["attack"] = o_.attack;
    j["clients"] = attackers_.size();
    j["value_bytes"] = value_bytes();
    j["sets"] = o_.attack == "watch" ? o_.sets : 0;
    j["hold_s"] = o_.hold_s;
    j["rss_before_kb"] = before_.rss_kb;
    j["rss_peak_kb"] = peak_kb_;
    j["rss_growth_mib"] = round1(static_cast<double>(peak_kb_ - before_.rss_kb) / mib);
    j["hwm_growth_mib"] = round1(static_cast<double>(after_.hwm_kb - before_.rss_kb) / mib);
    j["probes"] = ms.size();
    j["probe_p50_ms"] = ms.empty() ? 0.0 : round1(ms[ms.size() / 2]);
    j["probe_max_ms"] = ms.empty() ? 0.0 : round1(ms.back());
    j["probe_unanswered_ms"] = round1(unanswered_ms_);
    j["attack_s"] = round1(attack_s_);
    j["server_cpu_s"] = std::round(server_cpu_s_ * 100) / 100;
    j["attackers_dropped"] = dropped_;
    j["errors"] = errors_;
    j["first_error"] = first_error_;
    return j;
  }

  Options o_;
  asio::io_context io_{1};
  tcp::endpoint endpoint_;
  asio::steady_timer sample_timer_{io_}, probe_timer_{io_}, read_timer_{io_}, end_timer_{io_};
  std::vector<std::unique_ptr<tcp::socket>> attackers_;
  std::vector<size_t> received_;  // get: reply bytes each client read so far
  size_t reply_bytes_ = 0;
  ServerSample before_, after_;
  Clock::time_point attack_started_;
  double attack_s_ = 0, cpu_before_ = 0, server_cpu_s_ = 0;  // the attack's wall time, the server's CPU in it
  int64_t peak_kb_ = 0;
  std::vector<double> probes_ms_;
  std::optional<Clock::time_point> probe_started_;  // the probe in flight, if any
  double unanswered_ms_ = 0;                        // the probe unanswered at the end: its wait so far
  size_t dropped_ = 0;
  bool stopped_ = false;
  uint64_t errors_ = 0;
  std::string first_error_;
};

}  // namespace
}  // namespace ddprun::bench

int main(int argc, char** argv) {
  using ddprun::bench::Options;
  CLI::App app{"ddprun-store-attack: a hostile-reader attack on a TCPStore server, legacy dialect"};
  Options o;
  app.add_option("--host", o.host, "Server address");
  app.add_option("--port", o.port, "Server port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--server-pid", o.server_pid, "Server process to sample in /proc")->required();
  app.add_option("--attack", o.attack, "watch (watchers that never read) or get (slow readers of one value)")
      ->check(CLI::IsMember({"watch", "get"}));
  app.add_option("--clients", o.clients, "Attacking connections (default: watch 100, get 1000)");
  app.add_option("--value-bytes", o.value_bytes, "Size of the values (default: watch 2 MiB, get 8 MiB)");
  app.add_option("--sets", o.sets, "watch: SETs of the watched key")->check(CLI::PositiveNumber);
  app.add_option("--hold", o.hold_s, "Seconds of sampling and probing after the last attacking request")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--label", o.label, "Name of the server, copied to the output");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  ddprun::bench::raise_fd_limit();
  try {
    return ddprun::bench::Attack(o).run();
  } catch (const boost::system::system_error& e) {
    std::cerr << "ddprun-store-attack: " << o.host << ":" << o.port << ": " << e.what() << "\n";
    return 2;
  }
}
