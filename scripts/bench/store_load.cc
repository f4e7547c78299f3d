// ddprun-store-bench: a closed-loop load generator for TCPStore servers (ddprun-store and torch's own), in
// the legacy dialect (torch 1.13 / 2.0 numbering), so the same binary drives both servers.
//
//   ddprun-store-bench --port N [--host H] [--clients N] [--op set|get|add|mix] [--seconds S] [--warmup S]
//                      [--value-bytes B] [--idle N] [--server-pid PID] [--label NAME]
//
// What it does, in order, on one thread (one boost::asio::io_context):
//   1. raises RLIMIT_NOFILE to the hard limit;
//   2. opens --idle connections and keeps them open, silent, during the whole run (failures are counted,
//      not fatal);
//   3. opens --clients connections; client i uses key "/bench/<op>/<i>" (one namespace per op, so an ADD
//      never meets a value a SET left); for `get` each client first SETs it to --value-bytes bytes;
//   4. closed loop: every client sends one request, waits for the whole reply, checks it and sends the next;
//      after --warmup seconds it measures for --seconds seconds, then lets the requests in flight finish;
//   5. samples the server's memory and open descriptors from /proc/<--server-pid> while every connection is
//      still open, then sends GETNUMKEYS on every idle connection and counts those that answer;
//   6. prints one JSON line on stdout and exits.
//
// The ops (requests are encoded by rdzv::encode_request, replies read with rdzv::WireReader):
//   set  SET "/bench/set/<i>" <value>, immediately followed in the same write by GETNUMKEYS. A legacy SET has
//        no reply, so the GETNUMKEYS reply acknowledges it (a server handles one connection's requests in
//        order). One op = this pair; requests_per_s counts both requests.
//   get  GET "/bench/get/<i>" alone. Real torch 1.13 clients send WAIT before every GET; we send no
//        WAIT, to either server, so that the lookup itself is measured.
//   add  ADD "/bench/add/<i>/n" 1; each reply must be the previous one + 1.
//   mix  the three in turn on one client: SET "/bench/mix/<i>" (+ GETNUMKEYS), GET it, ADD "/bench/mix/<i>/n" 1;
//        one op = one of them (requests_per_s counts the GETNUMKEYS too).
//
// Output fields: label, op, clients, seconds, value_bytes, ops, ops_per_s, requests_per_s, p50_us, p99_us,
// max_us, errors (failed connects of active clients, broken connections, wrong replies, timeouts),
// first_error, idle_requested, idle_connected, idle_alive, and with --server-pid: server_rss_kb_before
// (before any connection), server_rss_kb and server_hwm_kb (VmRSS and VmHWM after the measurement, every
// connection still open), server_fds (its open descriptors then) and server_cpu_us_per_op (the server's
// CPU time, all threads, user + system, over the measured window, per op; -1 when unknown);
// bench_cpu_us_per_op is the same for this program. CPU per op tells servers apart when the server has idle
// time (few clients, many idle connections); when both processes are busy all the time it mostly reflects
// the throughput.
//
// Exit codes: 0 run completed without errors; 1 errors or a timeout (the JSON line is still printed);
// 2 bad flags or the host cannot be resolved. Every phase has a deadline, so the program always ends.

#include "scripts/bench/store_load.h"

namespace ddprun::bench::store_load {

// ---- Bench -----------------------------------------------------------------------------------------------

Bench::Bench(Options o) : o_(std::move(o)) {
  tcp::resolver resolver(io_);
  endpoint_ = resolver.resolve(o_.host, std::to_string(o_.port)).begin()->endpoint();
  ping_request_ = encode({make(rdzv::Op::kGetNumKeys)});
  latencies_ns_.reserve(static_cast<size_t>(o_.seconds * 400000) + 1024);
}

void Bench::arm_deadline(double seconds, std::function<void()> on_expiry) {
  deadline_.expires_after(std::chrono::duration_cast<Clock::duration>(Seconds(seconds)));
  deadline_.async_wait([cb = std::move(on_expiry)](const boost::system::error_code& ec) {
    if (!ec) cb();
  });
}

void Bench::connect_many(size_t count, std::function<void(Sockets)> done) {
  struct State {
    Sockets sockets;
    std::vector<char> connecting;  // per socket: its connect is in flight
    size_t next = 0;
    size_t in_flight = 0;
    bool finished = false;
    std::function<void(Sockets)> done;
  };
  auto st = std::make_shared<State>();
  st->sockets.resize(count);
  st->connecting.resize(count, 0);
  st->done = std::move(done);
  auto finish_if_done = [this, st] {
    if (st->finished || st->in_flight > 0 || st->next < st->sockets.size()) return;
    st->finished = true;
    deadline_.cancel();
    st->done(std::move(st->sockets));
  };
  // Starts connects up to the concurrency limit; each completion calls it again.
  auto launch = std::make_shared<std::function<void()>>();
  *launch = [this, st, finish_if_done, weak = std::weak_ptr(launch)] {
    while (!st->finished && st->in_flight < o_.connect_concurrency && st->next < st->sockets.size()) {
      size_t i = st->next++;
      ++st->in_flight;
      st->connecting[i] = 1;
      st->sockets[i] = std::make_unique<tcp::socket>(io_);
      st->sockets[i]->async_connect(endpoint_, [this, st, i, finish_if_done,
                                                launch = weak.lock()](const boost::system::error_code& ec) {
        --st->in_flight;
        st->connecting[i] = 0;
        if (ec) {
          if (phase_ == Phase::kConnectActive && ec != asio::error::operation_aborted) {
            error("connect to port " + std::to_string(endpoint_.port()) + ": " + ec.message());
          }
          st->sockets[i].reset();
        }
        (*launch)();
      });
    }
    finish_if_done();
  };
  arm_deadline(o_.connect_timeout_s, [this, st] {
    if (phase_ == Phase::kConnectActive) error("connecting the clients took over --connect-timeout");
    st->next = st->sockets.size();  // start no more; abort those in flight
    for (size_t i = 0; i < st->sockets.size(); ++i) {
      boost::system::error_code ignored;
      if (st->connecting[i]) st->sockets[i]->close(ignored);
    }
  });
  (*launch)();
}

void Bench::start_prepare() {
  phase_ = Phase::kPrepare;
  for (auto& c : clients_) {
    auto key = "/bench/" + o_.op + "/" + std::to_string(c->index());
    const std::string set =
        encode({make(rdzv::Op::kSet, key, std::string(o_.value_bytes, 'x')), make(rdzv::Op::kGetNumKeys)});
    const Client::Step set_step{set, ReplyKind::kInt, 's'}, get_step{encode({make(rdzv::Op::kGet, key)}),
                                                                      ReplyKind::kBytes, 'g'};
    const Client::Step add_step{encode({make(rdzv::Op::kAdd, key + "/n", std::nullopt, 1)}), ReplyKind::kInt, 'a'};
    if (o_.op == "set") {
      c->steps = {set_step};
    } else if (o_.op == "get") {
      c->steps = {get_step};
      prepare_requests_.push_back(set);
    } else if (o_.op == "add") {
      c->steps = {add_step};
    } else {
      c->steps = {set_step, get_step, add_step};  // mix: the GET reads what the SET before it wrote
    }
  }
  if (prepare_requests_.empty()) {
    start_run();
    return;
  }
  outstanding_ = clients_.size();
  arm_deadline(kPrepareTimeoutS, [this] {
    error("setting the keys took over " + std::to_string(kPrepareTimeoutS) + " s");
    finish();
  });
  for (size_t i = 0; i < clients_.size(); ++i) clients_[i]->issue(prepare_requests_[i], ReplyKind::kInt);
}

void Bench::start_run() {
  phase_ = Phase::kRun;
  deadline_.cancel();
  outstanding_ = clients_.size();
  auto start = Clock::now();
  measure_start_ = start + std::chrono::duration_cast<Clock::duration>(Seconds(o_.warmup));
  measure_end_ = measure_start_ + std::chrono::duration_cast<Clock::duration>(Seconds(o_.seconds));
  start_timer_.expires_at(measure_start_);
  start_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) cpu_start_ = sample_cpu(o_.server_pid);
  });
  measure_timer_.expires_at(measure_end_);
  measure_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    cpu_end_ = sample_cpu(o_.server_pid);
    stopping_ = true;
    arm_deadline(kPrepareTimeoutS, [this] {
      error("requests in flight at the end took over " + std::to_string(kPrepareTimeoutS) + " s");
      finish();
    });
  });
  if (clients_.empty()) {
    client_done();
    return;
  }
  for (auto& c : clients_) c->issue_step();
}

std::string Bench::check_reply(Client& c) {
  const char op = phase_ == Phase::kRun ? c.steps[c.step].op : 's';
  if (op == 's') return c.int_reply() >= 0 ? "" : "GETNUMKEYS replied " + std::to_string(c.int_reply());
  if (op == 'g') {
    return c.bytes_reply().size() == o_.value_bytes
               ? ""
               : "GET replied " + std::to_string(c.bytes_reply().size()) + " bytes, expected " +
                     std::to_string(o_.value_bytes);
  }
  auto expected = c.last_add ? *c.last_add + 1 : c.int_reply();
  c.last_add = c.int_reply();
  return c.int_reply() == expected
             ? ""
             : "ADD replied " + std::to_string(c.int_reply()) + ", expected " + std::to_string(expected);
}

void Bench::on_reply(Client& c) {
  auto now = Clock::now();
  if (auto wrong = check_reply(c); !wrong.empty()) {
    on_failure(c, wrong);
    return;
  }
  switch (phase_) {
    case Phase::kRun:
      if (now >= measure_start_ && now <= measure_end_) {
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - c.sent_at()).count();
        latencies_ns_.push_back(static_cast<uint32_t>(std::min<int64_t>(ns, UINT32_MAX)));
      }
      c.step = (c.step + 1) % c.steps.size();
      if (!stopping_) {
        c.issue_step();
        return;
      }
      break;
    case Phase::kIdleCheck:
      ++idle_alive_;
      break;
    default:
      break;
  }
  client_done();
}

void Bench::on_failure(Client& c, const std::string& what) {
  if (phase_ == Phase::kDone) return;
  c.close();
  // An idle connection that does not answer the final check is simply not alive; anything else is an error.
  if (phase_ != Phase::kIdleCheck && !what.empty()) error(what);
  client_done();
}

void Bench::client_done() {
  if (outstanding_ > 0) --outstanding_;
  if (outstanding_ > 0) return;
  if (phase_ == Phase::kPrepare) {
    start_run();
  } else if (phase_ == Phase::kRun) {
    measure_timer_.cancel();
    if (!stopping_) measure_end_ = Clock::now();  // every client failed early
    deadline_.cancel();
    start_idle_check();
  } else if (phase_ == Phase::kIdleCheck) {
    finish();
  }
}

void Bench::start_idle_check() {
  after_ = sample_server(o_.server_pid);  // every connection is still open here
  phase_ = Phase::kIdleCheck;
  outstanding_ = idle_.size();
  if (idle_.empty()) {
    finish();
    return;
  }
  arm_deadline(kIdleCheckTimeoutS, [this] { finish(); });
  for (auto& c : idle_) c->issue(ping_request_, ReplyKind::kInt);
}

void Bench::finish() {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  io_.stop();
}

nlohmann::ordered_json Bench::report() const {
  auto lat = latencies_ns_;
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) -> double {
    if (lat.empty()) return 0;
    size_t i = std::min(lat.size() - 1, static_cast<size_t>(p * static_cast<double>(lat.size())));
    return std::round(lat[i] / 100.0) / 10.0;  // µs with one decimal
  };
  double window = std::max(1e-9, Seconds(measure_end_ - measure_start_).count());
  double ops_per_s = static_cast<double>(lat.size()) / window;
  nlohmann::ordered_json j;
  j["label"] = o_.label;
  j["op"] = o_.op;
  j["clients"] = o_.clients;
  j["seconds"] = o_.seconds;
  j["value_bytes"] = o_.value_bytes;
  j["ops"] = lat.size();
  j["ops_per_s"] = std::round(ops_per_s);
  // A SET step is SET + GETNUMKEYS: set 2 requests per op, mix 4 per 3.
  j["requests_per_s"] = std::round(ops_per_s * (o_.op == "set" ? 2.0 : o_.op == "mix" ? 4.0 / 3 : 1.0));
  j["p50_us"] = pct(0.50);
  j["p99_us"] = pct(0.99);
  j["max_us"] = lat.empty() ? 0.0 : std::round(lat.back() / 100.0) / 10.0;
  // CPU per op, in µs, over the measured window: -1 when the window was cut short.
  auto per_op = [&](double CpuTimes::*field) -> double {
    if (!cpu_start_ || !cpu_end_ || lat.empty() || (*cpu_start_).*field < 0) return -1;
    return std::round(((*cpu_end_).*field - (*cpu_start_).*field) * 1e7 / static_cast<double>(lat.size())) /
           10.0;
  };
  j["server_cpu_us_per_op"] = per_op(&CpuTimes::server_s);
  j["bench_cpu_us_per_op"] = per_op(&CpuTimes::self_s);
  j["errors"] = errors_;
  j["first_error"] = first_error_;
  j["idle_requested"] = o_.idle;
  j["idle_connected"] = idle_connected_;
  j["idle_alive"] = idle_alive_;
  if (o_.server_pid > 0) {
    j["server_rss_kb_before"] = before_.rss_kb;
    j["server_rss_kb"] = after_.rss_kb;
    j["server_hwm_kb"] = after_.hwm_kb;
    j["server_fds"] = after_.fds;
  }
  return j;
}

int Bench::run() {
  before_ = sample_server(o_.server_pid);
  connect_many(o_.idle, [this](Sockets sockets) {
    for (auto& s : sockets) {
      if (!s) continue;
      s->non_blocking(true);
      idle_.push_back(std::make_unique<Client>(*this, std::move(*s), idle_.size()));
    }
    idle_connected_ = idle_.size();
    phase_ = Phase::kConnectActive;
    connect_many(o_.clients, [this](Sockets sockets) {
      for (auto& s : sockets) {
        if (!s) continue;  // the error is already counted
        s->set_option(tcp::no_delay(true));
        s->non_blocking(true);
        clients_.push_back(std::make_unique<Client>(*this, std::move(*s), clients_.size()));
      }
      if (clients_.size() < o_.clients) {
        finish();  // the failed connects are counted as errors
        return;
      }
      start_prepare();
    });
  });
  io_.run();
  std::cout << report().dump() << std::endl;
  return errors_ == 0 && phase_ == Phase::kDone ? 0 : 1;
}

}  // namespace ddprun::bench::store_load


int main(int argc, char** argv) {
  using ddprun::bench::store_load::Options;
  CLI::App app{"ddprun-store-bench: closed-loop load on a TCPStore server, legacy dialect"};
  Options o;
  app.add_option("--host", o.host, "Server address");
  app.add_option("--port", o.port, "Server port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--clients", o.clients, "Connections sending requests, one outstanding each");
  app.add_option("--op", o.op,
                 "set (SET + GETNUMKEYS), get (GET alone), add (ADD 1) or mix (each client: SET, GET, ADD in turn)")
      ->check(CLI::IsMember({"set", "get", "add", "mix"}));
  app.add_option("--seconds", o.seconds, "Measured time")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "Unmeasured load before the measurement")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--value-bytes", o.value_bytes, "Size of the values set and read");
  app.add_option("--idle", o.idle, "Connections opened first and kept open, silent, during the run");
  app.add_option("--connect-concurrency", o.connect_concurrency, "Connects in flight at once")
      ->check(CLI::PositiveNumber);
  app.add_option("--connect-timeout", o.connect_timeout_s, "Deadline of each connect phase, seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--server-pid", o.server_pid, "Server process to sample in /proc (memory, descriptors)");
  app.add_option("--label", o.label, "Name of the server, copied to the output");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  ddprun::bench::raise_fd_limit();
  std::unique_ptr<ddprun::bench::store_load::Bench> bench;
  try {
    bench = std::make_unique<ddprun::bench::store_load::Bench>(o);
  } catch (const boost::system::system_error& e) {
    std::cerr << "ddprun-store-bench: cannot resolve " << o.host << ":" << o.port << ": " << e.what() << "\n";
    return 2;
  }
  return bench->run();
}
