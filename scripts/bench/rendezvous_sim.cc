// ddprun-rendezvous-sim: N simulated nodes meet through one ddprun store on loopback, each node a real
// rdzv::DynamicRendezvous (torchrun's c10d backend as ddprun implements it). A benchmark, not a test.
//
//   ddprun-rendezvous-sim --nodes N [--min M] [--last-call-ms T] [--nodes-per-process P] [--timeout S]
//
// What it does, in order:
//   1. starts one StoreServerThread on 127.0.0.1, port 0, in this process;
//   2. starts ceil(N / P) node processes (this program again, with --worker): one process holds only about
//      20,000 descriptors here (the hard RLIMIT_NOFILE, which only a privileged process may raise) and each
//      node costs 8 of them (2 StoreClient connections, each a socket plus its own io_context's epoll,
//      eventfd and timerfd), so 4096 nodes need several processes. Each node process raises its soft limit,
//      constructs its nodes (identity "node-<idx>", local world size 1 + idx % 4, is_host=0, so every node
//      is a client of the one store) — connecting is not timed — and starts one thread per node with a
//      256 KiB stack, parked on a gate; then it reports "ready";
//   3. reads the server's request counter, opens every gate at once, and waits for every node to return from
//      next_rendezvous(). Each node stamps steady_clock (CLOCK_MONOTONIC, shared by the processes) just
//      before next_rendezvous and just after it returns;
//   4. verifies the round: every node returned round 0, group world size N, ranks 0..N-1 each exactly once
//      in identity order (all nodes are newcomers), base rank = sum of the local world sizes of lower ranks,
//      world size = sum of all local world sizes;
//   5. prints one JSON line: wall_ms = last return - first join; phases (first join -> last thread started,
//      -> first return, -> last return); store requests during the round, per node, and for the handshakes.
//
// Modes: min = max = N by default (the round closes the moment node N joins; no last call). --min M < N
// makes it elastic (M:N) with a last call of --last-call-ms (default 30 s) that the N-th arrival ends at once
// by setting r0/full: the measured time does not include the last-call timeout unless some node is missing.
//
// Exit codes: 0 round complete and verified; 1 a node failed, timed out, or the verification failed (the
// JSON line says why); 2 bad flags. Every phase has a deadline (--timeout); node processes are killed and
// reaped at the end, and exit by themselves if this process dies first (their start pipe closes).
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <latch>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "rendezvous/c10d/dynamic_rendezvous.h"
#include "rendezvous/store/store_server.h"
#include "scripts/bench/fd_limit.h"

extern char** environ;

namespace ddprun::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kThreadStack = 256 * 1024;

struct Options {
  int nodes = 64;
  int min_nodes = 0;  // 0: = nodes
  int last_call_ms = 30000;
  int nodes_per_process = 1024;
  double timeout_s = 120;
  // Worker role (internal).
  bool worker = false;
  int port = 0;
  int first = 0;
  int count = 0;
};

int local_world_size(int idx) {
  return 1 + idx % 4;
}

// CPU time (user + system) this process has used so far, in milliseconds.
double cpu_ms() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto ms = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) * 1e3 + tv.tv_usec / 1e3; };
  return ms(ru.ru_utime) + ms(ru.ru_stime);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Runs `fn` on a thread with a small stack; returns the thread (join it with pthread_join).
pthread_t start_thread(std::function<void()> fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kThreadStack);
  auto* heap = new std::function<void()>(std::move(fn));
  pthread_t t{};
  int rc = pthread_create(
      &t, &attr,
      [](void* p) -> void* {
        std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(p));
        (*f)();
        return nullptr;
      },
      heap);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    delete heap;
    throw std::runtime_error("pthread_create: " + std::string(strerror(rc)));
  }
  return t;
}

// ---- node process ---------------------------------------------------------------------------------------
// Output, one line each: "ready", then "cpu <ms used from the gate to the last return>", per node
// "node <idx> <round> <rank> <nodes> <base> <world> <t0> <t1>" or "error <idx> <message>", then "end".
int run_worker(const Options& o) {
  raise_fd_limit();
  spdlog::set_level(spdlog::level::warn);
  const int min = o.min_nodes > 0 ? o.min_nodes : o.nodes;
  std::vector<std::unique_ptr<rdzv::DynamicRendezvous>> nodes;
  for (int i = o.first; i < o.first + o.count; ++i) {
    rdzv::DynamicRendezvousOptions ro;
    ro.run_id = "sim";
    ro.min_nodes = min;
    ro.max_nodes = o.nodes;
    ro.endpoint_host = "127.0.0.1";
    ro.endpoint_port = static_cast<uint16_t>(o.port);
    ro.is_host = false;
    // A standby store is a server thread per agent process; thousands in this one process would measure the
    // simulation, not the rendezvous (which is the same with or without failover).
    ro.failover = false;
    char id[32];
    std::snprintf(id, sizeof id, "node-%05d", i);
    ro.identity = id;
    ro.host = id;
    auto t = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
    ro.join_timeout = t;
    ro.read_timeout = t;
    ro.close_timeout = t;
    ro.last_call_timeout = std::chrono::milliseconds(o.last_call_ms);
    nodes.push_back(std::make_unique<rdzv::DynamicRendezvous>(std::move(ro)));
  }
  struct Result {
    rdzv::RendezvousInfo info;
    int64_t t0 = 0, t1 = 0;
    std::string error;
  };
  std::vector<Result> results(nodes.size());
  std::latch gate(1);
  std::vector<pthread_t> threads;
  for (size_t k = 0; k < nodes.size(); ++k) {
    threads.push_back(start_thread([&, k] {
      gate.wait();
      int idx = o.first + static_cast<int>(k);
      results[k].t0 = now_ns();
      try {
        results[k].info = nodes[k]->next_rendezvous(local_world_size(idx));
      } catch (const std::exception& e) {
        results[k].error = e.what();
      }
      results[k].t1 = now_ns();
    }));
  }
  std::cout << "ready" << std::endl;
  char go = 0;
  if (::read(STDIN_FILENO, &go, 1) != 1) {
    std::cerr << "node process: no start signal\n";
    std::_Exit(1);  // the parent is gone; the nodes would wait for their gate forever
  }
  double cpu0 = cpu_ms();
  gate.count_down();
  for (auto t : threads) pthread_join(t, nullptr);
  std::ostringstream out;
  out << "cpu " << cpu_ms() - cpu0 << "\n";
  for (size_t k = 0; k < nodes.size(); ++k) {
    int idx = o.first + static_cast<int>(k);
    const auto& r = results[k];
    if (!r.error.empty()) {
      std::string msg = r.error;
      std::replace(msg.begin(), msg.end(), '\n', ' ');
      out << "error " << idx << " " << msg << "\n";
    } else {
      out << "node " << idx << " " << r.info.round << " " << r.info.group_rank << " "
          << r.info.group_world_size << " " << r.info.base_rank << " " << r.info.world_size << " " << r.t0
          << " " << r.t1 << "\n";
    }
  }
  out << "end\n";
  std::cout << out.str() << std::flush;
  std::_Exit(0);  // skip closing thousands of connections one by one; the parent is done with us
}

// ---- parent ---------------------------------------------------------------------------------------------
struct Worker {
  pid_t pid = -1;
  int to = -1;    // its stdin
  int from = -1;  // its stdout
  std::string buffer;
  bool ended = false;
};

Worker spawn_worker(const Options& o, int port, int first, int count) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe: " + std::string(strerror(errno)));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  for (int fd : {in[0], in[1], out[0], out[1]}) posix_spawn_file_actions_addclose(&fa, fd);
  std::vector<std::string> args = {"ddprun-rendezvous-sim",
                                   "--worker",
                                   "--port",
                                   std::to_string(port),
                                   "--first",
                                   std::to_string(first),
                                   "--count",
                                   std::to_string(count),
                                   "--nodes",
                                   std::to_string(o.nodes),
                                   "--min",
                                   std::to_string(o.min_nodes),
                                   "--last-call-ms",
                                   std::to_string(o.last_call_ms),
                                   "--timeout",
                                   std::to_string(o.timeout_s)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Worker w;
  int rc = posix_spawn(&w.pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (rc != 0) throw std::runtime_error("posix_spawn: " + std::string(strerror(rc)));
  w.to = in[1];
  w.from = out[0];
  return w;
}

// Reads lines from every worker until `done(worker, line)` has been satisfied for all of them or the
// deadline passes (false).
bool read_lines(std::vector<Worker>& workers, Clock::time_point deadline,
                const std::function<bool(Worker&, const std::string&)>& on_line) {
  std::vector<bool> finished(workers.size(), false);
  while (std::count(finished.begin(), finished.end(), false) > 0) {
    std::vector<pollfd> fds;
    std::vector<size_t> who;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (!finished[i]) {
        fds.push_back({workers[i].from, POLLIN, 0});
        who.push_back(i);
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    if (poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) return false;
    for (size_t j = 0; j < fds.size(); ++j) {
      if (!(fds[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Worker& w = workers[who[j]];
      char buf[65536];
      ssize_t n = ::read(w.from, buf, sizeof buf);
      if (n <= 0) return false;  // the worker died
      w.buffer.append(buf, static_cast<size_t>(n));
      size_t pos;
      while (!finished[who[j]] && (pos = w.buffer.find('\n')) != std::string::npos) {
        std::string line = w.buffer.substr(0, pos);
        w.buffer.erase(0, pos + 1);
        if (on_line(w, line)) finished[who[j]] = true;
      }
    }
  }
  return true;
}

struct NodeResult {
  int idx = -1, round = -1, rank = -1, nodes = 0, base = 0, world = 0;
  int64_t t0 = 0, t1 = 0;
};

// Checks the round; returns "" when it is right, else what is wrong.
std::string verify(const std::vector<NodeResult>& r, int n) {
  if (static_cast<int>(r.size()) != n)
    return std::to_string(r.size()) + " of " + std::to_string(n) + " returned";
  std::vector<int> lws_by_rank(static_cast<size_t>(n), -1);
  int world = 0;
  for (const auto& x : r) {
    if (x.round != 0) return "node " + std::to_string(x.idx) + " got round " + std::to_string(x.round);
    if (x.nodes != n) return "node " + std::to_string(x.idx) + " got " + std::to_string(x.nodes) + " nodes";
    if (x.rank < 0 || x.rank >= n || lws_by_rank[static_cast<size_t>(x.rank)] != -1) {
      return "rank " + std::to_string(x.rank) + " given twice or out of range";
    }
    // Every node is a newcomer: ranks follow identity order, and identities follow idx.
    if (x.rank != x.idx) return "node " + std::to_string(x.idx) + " got rank " + std::to_string(x.rank);
    lws_by_rank[static_cast<size_t>(x.rank)] = local_world_size(x.idx);
    world += local_world_size(x.idx);
  }
  std::vector<int> base(static_cast<size_t>(n), 0);
  for (size_t k = 1; k < base.size(); ++k) base[k] = base[k - 1] + lws_by_rank[k - 1];
  for (const auto& x : r) {
    if (x.base != base[static_cast<size_t>(x.rank)])
      return "rank " + std::to_string(x.rank) + ": wrong base rank";
    if (x.world != world) return "node " + std::to_string(x.idx) + ": world size " + std::to_string(x.world);
  }
  return "";
}

int run_parent(const Options& o) {
  raise_fd_limit();
  spdlog::set_level(spdlog::level::warn);
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  rdzv::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  rdzv::StoreServerThread server(so);
  const auto stats0 = server.stats();

  std::vector<Worker> workers;
  for (int first = 0; first < o.nodes; first += o.nodes_per_process) {
    workers.push_back(spawn_worker(o, server.port(), first, std::min(o.nodes_per_process, o.nodes - first)));
  }
  nlohmann::json out = {{"nodes", o.nodes},
                        {"min_nodes", o.min_nodes > 0 ? o.min_nodes : o.nodes},
                        {"max_nodes", o.nodes},
                        {"last_call_ms", o.min_nodes > 0 && o.min_nodes < o.nodes ? o.last_call_ms : 0},
                        {"processes", workers.size()}};
  std::vector<NodeResult> results;
  std::string error;
  double server_cpu0 = 0, server_cpu1 = 0, nodes_cpu = 0;
  size_t cpu_reports = 0;
  auto setup_start = Clock::now();
  bool ready =
      read_lines(workers, deadline, [](Worker&, const std::string& line) { return line == "ready"; });
  out["setup_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - setup_start).count();
  rdzv::StoreServerStats stats1 = server.stats();
  if (!ready) {
    error = "the node processes did not get ready in time";
  } else {
    server_cpu0 = cpu_ms();
    for (auto& w : workers) {
      if (::write(w.to, "g", 1) != 1) error = "cannot start a node process";
    }
    bool done = read_lines(workers, deadline, [&](Worker&, const std::string& line) {
      std::istringstream in(line);
      std::string tag;
      in >> tag;
      if (tag == "end") return true;
      if (tag == "cpu") {
        double ms = 0;
        in >> ms;
        nodes_cpu += ms;
        // The round is over once every node process has reported.
        if (++cpu_reports == workers.size()) server_cpu1 = cpu_ms();
      } else if (tag == "node") {
        NodeResult r;
        in >> r.idx >> r.round >> r.rank >> r.nodes >> r.base >> r.world >> r.t0 >> r.t1;
        results.push_back(r);
      } else if (tag == "error" && error.empty()) {
        error = line;
      }
      return false;
    });
    if (!done && error.empty()) error = "not every node returned within --timeout";
  }
  auto stats2 = server.stats();
  for (auto& w : workers) {
    kill(w.pid, SIGKILL);  // no-op for those that have exited
    waitpid(w.pid, nullptr, 0);
    close(w.to);
    close(w.from);
  }
  if (error.empty()) error = verify(results, o.nodes);
  if (!results.empty()) {
    int64_t first = INT64_MAX, last_start = 0, first_done = INT64_MAX, last_done = 0;
    for (const auto& r : results) {
      first = std::min(first, r.t0);
      last_start = std::max(last_start, r.t0);
      first_done = std::min(first_done, r.t1);
      last_done = std::max(last_done, r.t1);
    }
    auto ms = [&](int64_t t) { return static_cast<double>(t - first) / 1e6; };
    out["wall_ms"] = ms(last_done);
    out["phases_ms"] = {{"last_node_started", ms(last_start)},
                        {"first_node_returned", ms(first_done)},
                        {"last_node_returned", ms(last_done)}};
  }
  uint64_t round_requests = stats2.requests - stats1.requests;
  out["requests_round"] = round_requests;
  out["requests_per_node"] = static_cast<double>(round_requests) / o.nodes;
  out["requests_connect"] = stats1.requests - stats0.requests;
  out["connections"] = stats1.connections;
  // This process's CPU during the round is the store's (its main thread sleeps in poll()).
  out["cpu_ms"] = {{"store", server_cpu1 - server_cpu0}, {"nodes", nodes_cpu}};
  out["ok"] = error.empty();
  if (!error.empty()) out["error"] = error;
  std::cout << out.dump() << std::endl;
  return error.empty() ? 0 : 1;
}

}  // namespace
}  // namespace ddprun::bench

int main(int argc, char** argv) {
  using ddprun::bench::Options;
  CLI::App app{"ddprun-rendezvous-sim: N DynamicRendezvous nodes meet through one store on loopback"};
  Options o;
  app.add_option("--nodes", o.nodes, "Simulated nodes (max_nodes)")->check(CLI::Range(1, 100000));
  app.add_option("--min", o.min_nodes, "min_nodes (default: = --nodes)")->check(CLI::Range(0, 100000));
  app.add_option("--last-call-ms", o.last_call_ms, "last_call_timeout when --min < --nodes")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--nodes-per-process", o.nodes_per_process, "Nodes per node process (descriptor limit)")
      ->check(CLI::Range(1, 2400));
  app.add_option("--timeout", o.timeout_s, "Deadline of the whole run, seconds")->check(CLI::PositiveNumber);
  app.add_flag("--worker", o.worker)->group("");
  app.add_option("--port", o.port)->group("");
  app.add_option("--first", o.first)->group("");
  app.add_option("--count", o.count)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (o.min_nodes > o.nodes) {
    std::cerr << "ddprun-rendezvous-sim: --min must not exceed --nodes\n";
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  try {
    return o.worker ? ddprun::bench::run_worker(o) : ddprun::bench::run_parent(o);
  } catch (const std::exception& e) {
    std::cerr << "ddprun-rendezvous-sim: " << e.what() << "\n";
    return 1;
  }
}
