// ddprun-rendezvous-replay: the requests of DynamicRendezvous's first round, replayed for N nodes by one
// event-driven client thread against one StoreServerThread on loopback (in a child process: see
// StoreProcess). A benchmark, not a test.
//
//   ddprun-rendezvous-replay --nodes N [--min M] [--timeout S] [--secret | --munge-socket PATH]
//
// --secret: the store requires the job's secret (--rdzv_secret_file, docs/security.md) and every node's
// connection does AUTH (HMAC-SHA256 both ways) after VALIDATE + PING; the handshakes are timed apart
// (handshake_ms, cpu_ms.store_handshake) and the round then runs on authenticated connections.
// --munge-socket: the same with MUNGE credentials through the munged at PATH (both sides: the nodes' proofs
// are made on the client thread, one at a time). During the handshakes a probe connection of its own (a
// thread) PINGs the store back to back: its round trips (probe_ms: median, p99, max, and `stalled`, the time
// spent in round trips of 10 ms or more) are what every heartbeat and WAIT of a job would wait meanwhile;
// cpu_ms.store_io_thread is the CPU time of the store's io thread alone during the handshakes (the rest of
// cpu_ms.store_handshake ran on other threads of the store).
//
// Why: ddprun-rendezvous-sim runs N real DynamicRendezvous objects, one thread and two blocking StoreClient
// connections (each with its own io_context) per node; on a 2-core machine those simulated clients use about
// twice the CPU the store does, so its wall time measures the simulation as much as the protocol. Here the
// clients cost next to nothing (one thread, one io_context, N sockets, no thread switches), so the time is
// what the protocol costs the store, as when every node is a machine of its own.
//
// Fidelity: each node sends the same requests, with the same keys and values, in the same order, and waits
// for each reply before the next, as rendezvous/c10d/dynamic_rendezvous.cc (next_rendezvous +
// wait_closed_or_close for round 0, nobody failing, nobody late): CHECK closed, [ADD failures/<identity> 0
// when min < max], SET live/<identity>, CHECK round, ADD r0/joined 1, SET r0/node/<i>, [SET r0/full by
// arrival max], then the node whose arrival makes the count min [WAITs for r0/full when min < max] and closes
// (rendezvous/c10d/dynamic_closing.cc): ADD joined 0, COMPARE_SET closed, WAIT + MULTI_GET the descriptors,
// rdzv::assign_ranks (rendezvous/c10d/c10d_round.h), MULTI_SET r0/members, r0/dropped and the assignments,
// SET round; every other node WAITs for r0/closed. Then each node: WAIT + GET closed, WAIT assign/<i>, WAIT +
// GET assign/<i> (r0/dropped is read from round 1 on). Descriptors carry a standby endpoint (each node as if
// on a host of its own) and assignments the round's successors, as with the store failover on. The store must
// count the same requests per node as ddprun-rendezvous-sim does (11 for min = max): if they differ,
// dynamic_rendezvous.cc changed and this replay must follow it. Only the main connection of each node is
// opened (the watcher connection sends nothing during a round).
//
// Output: one JSON line like ddprun-rendezvous-sim's (wall_ms, phases_ms, requests_round, requests_per_node,
// cpu_ms {store, clients}); exit 0 when the round completed and verified, 1 otherwise, 2 bad flags.
#include <dirent.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20
#include <vector>

#include "rendezvous/auth/hmac_auth.h"
#include "rendezvous/auth/munge_auth.h"
#include "rendezvous/c10d/c10d_round.h"
#include "rendezvous/c10d/store_failover.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/wire_codec.h"
#include "scripts/bench/fd_limit.h"

namespace ddprun::bench {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using rdzv::Op;
using rdzv::Request;
using Clock = std::chrono::steady_clock;

const std::string kPrefix = "/ddprun/sim/";  // StoreClient's "/" + DynamicRendezvous::key()
int local_world_size(int idx) {
  return 1 + idx % 4;
}

// Node idx's standby store, as its agent would advertise it (a host of its own, the endpoint list's port).
std::string standby_of(int idx) {
  return "10." + std::to_string(idx / 65536) + "." + std::to_string(idx / 256 % 256) + "." +
         std::to_string(idx % 256) + ":29400";
}

// The round's successors as the closer writes them into every assignment: the first standbys by rank.
rdzv::StoreFailover::Successors successors_of(const std::vector<std::string>& standby_by_rank) {
  rdzv::StoreFailover::Successors s;
  for (const auto& sb : standby_by_rank) {
    if (s.endpoints.size() == rdzv::StoreFailover::kSuccessors) break;
    std::string error;
    s.endpoints.push_back(*rdzv::parse_endpoint(sb, std::nullopt, error));
  }
  return s;
}
std::string rk(const std::string& k) {
  return kPrefix + "r0/" + k;
}

double cpu_ms(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// This process's threads (their ids).
std::set<std::string> task_ids() {
  std::set<std::string> out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') out.insert(e->d_name);
    }
    closedir(d);
  }
  return out;
}

// CPU time of thread `tid` of this process (its schedstat: nanoseconds on a CPU); 0 when unknown.
double thread_cpu_ms(const std::string& tid) {
  std::ifstream in("/proc/self/task/" + tid + "/schedstat");
  double ns = 0;
  return in >> ns ? ns / 1e6 : 0;
}

// The store in a child process of its own, so that this process's descriptors are all the clients': a node
// costs one socket on each side, and one process holds about 20,000 descriptors here (16,000 nodes need
// 32,000). The child serves until its command pipe closes; stats() asks it for its counters and CPU time.
class StoreProcess {
 public:
  struct Stats {
    uint64_t requests = 0, connections = 0;
    double cpu_ms = 0;
    double io_thread_cpu_ms = 0;  // the store's io thread alone
  };

  // `auth`: what the store requires of its clients (null: nothing).
  explicit StoreProcess(std::shared_ptr<const rdzv::StoreAuth> auth) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      close(to_child[1]);
      close(from_child[0]);
      serve(to_child[0], from_child[1], std::move(auth));  // never returns
    }
    close(to_child[0]);
    close(from_child[1]);
    out_ = to_child[1];
    in_ = fdopen(from_child[0], "r");
    port_ = static_cast<uint16_t>(std::stoul(line()));
  }
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;
  ~StoreProcess() {
    close(out_);
    fclose(in_);
    waitpid(pid_, nullptr, 0);
  }

  uint16_t port() const { return port_; }
  Stats stats() {
    if (write(out_, "s", 1) != 1) throw std::runtime_error("the store process is gone");
    Stats st;
    std::istringstream(line()) >> st.requests >> st.connections >> st.cpu_ms >> st.io_thread_cpu_ms;
    return st;
  }

 private:
  [[noreturn]] static void serve(int commands, int replies, std::shared_ptr<const rdzv::StoreAuth> auth) {
    raise_fd_limit();
    spdlog::set_level(spdlog::level::warn);
    {
      const auto before = task_ids();
      rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1", .auth = std::move(auth)});
      // The one thread the server started is its io thread (any other starts later, on demand).
      std::string io_thread;
      for (const auto& tid : task_ids()) {
        if (!before.count(tid)) io_thread = tid;
      }
      auto say = [replies](const std::string& text) {
        return write(replies, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      };
      char c = 0;
      bool ok = say(std::to_string(server.port()) + "\n");
      while (ok && read(commands, &c, 1) == 1) {
        const auto st = server.stats();
        ok = say(std::to_string(st.requests) + " " + std::to_string(st.connections) + " " +
                 std::to_string(cpu_ms(CLOCK_PROCESS_CPUTIME_ID)) + " " +
                 std::to_string(thread_cpu_ms(io_thread)) + "\n");
      }
    }
    _exit(0);
  }
  std::string line() {
    char buf[256];
    if (!fgets(buf, sizeof buf, in_)) throw std::runtime_error("the store process did not answer");
    return buf;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  FILE* in_ = nullptr;
  uint16_t port_ = 0;
};

// What a request's reply is made of.
enum class Reply { kNone, kU8, kU32, kI64, kBytes, kManyBytes };

struct Round;

// One simulated node: a socket, a receive buffer and the step it is at.
class Node {
 public:
  Node(asio::io_context& io, Round& round, int idx) : socket_(io), round_(round), idx_(idx) {}
  void connect(const tcp::endpoint& ep) {
    socket_.connect(ep);
    socket_.set_option(tcp::no_delay(true));
  }
  // Sends `req`; when the whole reply is in, calls `then` with its fields (ints in `num`, byte strings in
  // `strs`). `many` is the count for kManyBytes.
  void call(Request req, Reply kind, std::function<void()> then, size_t many = 0);
  void run();  // the protocol, step by step (below)

  int64_t num = 0;
  std::vector<std::string> strs;
  Clock::time_point t0, t1;
  std::string assignment;
  int idx() const { return idx_; }

 private:
  void read_reply(Reply kind, size_t many, std::function<void()> then);
  bool parse(Reply kind, size_t many);
  void close_round();
  void finish();

  tcp::socket socket_;
  Round& round_;
  int idx_;
  int64_t index_ = -1;
  std::string out_;
  std::vector<uint8_t> in_;
  size_t in_len_ = 0;
};

struct Round {
  int nodes = 0, min = 0;
  int returned = 0;
  std::string error;
  asio::io_context* io = nullptr;
  std::function<void()> on_all_returned;
};

void Node::call(Request req, Reply kind, std::function<void()> then, size_t many) {
  out_.clear();
  rdzv::encode_request(rdzv::Dialect::kModern, req, out_);
  asio::async_write(socket_, asio::buffer(out_), [this, kind, many, then = std::move(then)](auto ec, size_t) {
    if (ec) {
      round_.error = "write: " + ec.message();
      return round_.io->stop();
    }
    if (kind == Reply::kNone) return then();
    read_reply(kind, many, then);
  });
}

void Node::read_reply(Reply kind, size_t many, std::function<void()> then) {
  if (parse(kind, many)) return then();
  if (in_.size() - in_len_ < 4096) in_.resize(std::max<size_t>(in_.size() * 2, 8192));
  socket_.async_read_some(asio::buffer(in_.data() + in_len_, in_.size() - in_len_),
                          [this, kind, many, then = std::move(then)](auto ec, size_t n) {
                            if (ec) {
                              round_.error = "read: " + ec.message();
                              return round_.io->stop();
                            }
                            in_len_ += n;
                            read_reply(kind, many, then);
                          });
}

// Takes one complete reply off the buffer; false while it is incomplete.
bool Node::parse(Reply kind, size_t many) {
  rdzv::WireReader r(std::span<const uint8_t>(in_.data(), in_len_));
  strs.clear();
  bool ok = true;
  uint8_t u8 = 0;
  uint32_t u32 = 0;
  switch (kind) {
    case Reply::kNone:
      break;
    case Reply::kU8:
      ok = r.u8(u8), num = u8;
      break;
    case Reply::kU32:
      ok = r.u32(u32), num = u32;
      break;
    case Reply::kI64:
      ok = r.i64(num);
      break;
    case Reply::kBytes:
    case Reply::kManyBytes:
      for (size_t i = 0; ok && i < (kind == Reply::kBytes ? 1 : many); ++i) {
        std::string s;
        ok = r.bytes(s, SIZE_MAX) == rdzv::WireReader::BytesStatus::kOk;
        strs.push_back(std::move(s));
      }
      break;
  }
  if (!ok) return false;
  std::memmove(in_.data(), in_.data() + r.position(), in_len_ - r.position());
  in_len_ -= r.position();
  return true;
}

Request req(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
            int64_t delta = 0) {
  return Request{.op = op, .keys = std::move(keys), .values = std::move(values), .delta = delta};
}

void Node::run() {
  const bool elastic = round_.min < round_.nodes;
  char id[32];
  std::snprintf(id, sizeof id, "node-%05d", idx_);
  const std::string identity = id;
  t0 = Clock::now();
  auto join = [this, identity] {
    call(req(Op::kCheck, {kPrefix + "round"}), Reply::kU8, [this, identity] {
      call(req(Op::kAdd, {rk("joined")}, {}, 1), Reply::kI64, [this, identity] {
        index_ = num - 1;
        const std::string desc = rdzv::encode(rdzv::NodeDescriptor{.identity = identity,
                                                                   .previous_rank = -1,
                                                                   .local_world_size = local_world_size(idx_),
                                                                   .standby = standby_of(idx_)});
        call(req(Op::kSet, {rk("node/" + std::to_string(index_))}, {desc}), Reply::kNone, [this] {
          auto after_full = [this] {
            if (index_ + 1 == round_.min) return close_round();
            call(req(Op::kWait, {rk("closed")}), Reply::kU8, [this] { finish(); });
          };
          if (index_ + 1 != round_.nodes) return after_full();
          call(req(Op::kSet, {rk("full")}, {"1"}), Reply::kNone, after_full);
        });
      });
    });
  };
  auto announce = [this, identity, join] {
    call(req(Op::kSet, {kPrefix + "live/" + identity}, {"1"}), Reply::kNone, join);
  };
  call(req(Op::kCheck, {kPrefix + "closed"}), Reply::kU8, [this, elastic, identity, announce] {
    if (!elastic) return announce();
    call(req(Op::kAdd, {kPrefix + "failures/" + identity}, {}, 0), Reply::kI64, announce);
  });
}

void Node::close_round() {
  auto close = [this] {
    call(req(Op::kAdd, {rk("joined")}, {}, 0), Reply::kI64, [this] {
      auto count = std::min<int64_t>(num, round_.nodes);
      call(req(Op::kCompareSet, {rk("closed")}, {"", std::to_string(count)}), Reply::kBytes, [this, count] {
        std::vector<std::string> keys;
        for (int64_t i = 0; i < count; ++i) keys.push_back(rk("node/" + std::to_string(i)));
        call(req(Op::kWait, keys), Reply::kU8, [this, keys, count] {
          call(
              req(Op::kMultiGet, keys), Reply::kManyBytes,
              [this] {
                std::vector<rdzv::NodeDescriptor> descriptors;
                for (const auto& d : strs) {
                  rdzv::UnreadableField why;
                  descriptors.push_back(rdzv::decode_node_descriptor(d, why).value());
                }
                const std::vector<rdzv::RankAssignment> assignments = rdzv::assign_ranks(descriptors);
                std::vector<std::string> by_rank(descriptors.size());
                for (size_t i = 0; i < descriptors.size(); ++i)
                  by_rank[static_cast<size_t>(assignments[i].node_rank)] = descriptors[i].identity;
                std::vector<std::string> keys{rk("members"), rk("dropped")};
                std::vector<std::string> values{rdzv::encode_identities(by_rank), ""};
                for (size_t i = 0; i < assignments.size(); ++i) {
                  keys.push_back(rk("assign/" + std::to_string(i)));
                  values.push_back(rdzv::encode(assignments[i]));
                }
                call(req(Op::kMultiSet, keys, values), Reply::kNone, [this] {
                  call(req(Op::kSet, {kPrefix + "round"}, {"0"}), Reply::kNone, [this] { finish(); });
                });
              },
              static_cast<size_t>(count));
        });
      });
    });
  };
  if (round_.min == round_.nodes) return close();
  call(req(Op::kWait, {rk("full")}), Reply::kU8, close);  // the last call, ended by the max-th arrival
}

// After the close: the node reads the node count and its assignment, as next_rendezvous does.
void Node::finish() {
  const std::string assign = rk("assign/" + std::to_string(index_));
  call(req(Op::kWait, {rk("closed")}), Reply::kU8, [this, assign] {
    call(req(Op::kGet, {rk("closed")}), Reply::kBytes, [this, assign] {
      call(req(Op::kWait, {assign}), Reply::kU8, [this, assign] {
        call(req(Op::kWait, {assign}), Reply::kU8, [this, assign] {
          call(req(Op::kGet, {assign}), Reply::kBytes, [this] {
            assignment = strs.at(0);
            t1 = Clock::now();
            if (++round_.returned == round_.nodes) round_.on_all_returned();
          });
        });
      });
    });
  });
}

// Checks each assignment "<rank>|<nodes>|<base>|<world>|<successors>"; "" when the round is right.
std::string verify(const std::vector<std::unique_ptr<Node>>& nodes) {
  int n = static_cast<int>(nodes.size()), world = 0;
  std::vector<std::string> standbys;
  for (int i = 0; i < n; ++i) {
    world += local_world_size(i);
    standbys.push_back(standby_of(i));
  }
  const rdzv::StoreFailover::Successors successors = successors_of(standbys);
  int base = 0;
  for (const auto& node : nodes) {  // every node is a newcomer: rank = identity order = idx
    const std::string want = rdzv::encode(rdzv::RankAssignment{.node_rank = node->idx(),
                                                               .nodes = n,
                                                               .base_rank = base,
                                                               .world_size = world,
                                                               .successors = successors});
    if (node->assignment != want)
      return "node " + std::to_string(node->idx()) + " got '" + node->assignment + "'";
    base += local_world_size(node->idx());
  }
  return "";
}

// A connection of its own that PINGs the store back to back until stop(): the round trips a heartbeat would
// see meanwhile.
class Probe {
 public:
  explicit Probe(uint16_t port) {
    thread_ = std::thread([this, port] {
      rdzv::StoreClient c("127.0.0.1", port, rdzv::StoreClientOptions{.timeout = std::chrono::seconds(120)});
      while (!stop_) rtt_ms_.push_back(static_cast<double>(c.ping().count()) / 1e3);
    });
  }
  // Stops it; the round trips: median, p99, max (ms), how many, and `stalled`: the time spent in round trips
  // of 10 ms or more (the time the store left a heartbeat waiting that long).
  nlohmann::json stop() {
    stop_ = true;
    thread_.join();
    std::sort(rtt_ms_.begin(), rtt_ms_.end());
    auto at = [&](double q) {
      return rtt_ms_.empty() ? 0 : rtt_ms_[static_cast<size_t>(q * static_cast<double>(rtt_ms_.size() - 1))];
    };
    double stalled = 0;
    for (double ms : rtt_ms_) stalled += ms >= 10 ? ms : 0;
    return {{"median", at(0.5)},
            {"p99", at(0.99)},
            {"max", at(1)},
            {"pings", rtt_ms_.size()},
            {"stalled", stalled}};
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<double> rtt_ms_;
  std::thread thread_;
};

int run(int n, int min, double timeout_s, bool secret, const std::string& munge_socket) {
  raise_fd_limit();
  spdlog::set_level(spdlog::level::warn);
  std::shared_ptr<const rdzv::StoreAuth> auth;
  if (secret) auth = std::make_shared<rdzv::HmacAuth>("the replay's job secret 0123456789");
  if (!munge_socket.empty()) auth = std::make_shared<rdzv::MungeAuth>(munge_socket, "run replay");
  StoreProcess server(auth);  // before any thread or io_context of this process: it forks
  asio::io_context io;
  Round round{.nodes = n, .min = min, .io = &io};
  tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), server.port());
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < n; ++i) {
    nodes.push_back(std::make_unique<Node>(io, round, i));
    nodes.back()->connect(ep);
  }
  asio::steady_timer deadline(io, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  deadline.async_wait([&](auto ec) {
    if (!ec && round.error.empty()) round.error = "not every node returned within --timeout";
    io.stop();
  });
  // The handshake of each connection as StoreClient does it (VALIDATE + PING, and AUTH with --secret); timed
  // apart from the round.
  int shaken = 0;
  asio::thread_pool nodes_cpu(4);  // the nodes' own proofs (see authenticate)
  const auto stats0 = server.stats();
  Probe probe(server.port());
  const auto handshakes_began = Clock::now();
  for (auto& node : nodes) {
    Node* p = node.get();
    auto shaken_one = [&] {
      if (++shaken == n) io.stop();
    };
    auto authenticate = [&, p, shaken_one] {
      if (!auth) return shaken_one();
      auto nonce = std::make_shared<std::string>(auth->nonce());
      p->call(
          Request{.op = Op::kAuth, .values = {*nonce}, .number = 1}, Reply::kManyBytes,
          [&, p, nonce, shaken_one] {
            // Each node checks the store's proof and makes its own on its own machine: here on `nodes_cpu`,
            // so that the store meets the handshakes of many nodes at once, as in a job's start.
            asio::post(nodes_cpu,
                       [&, p, nonce, shaken_one, store_nonce = p->strs.at(0), store_proof = p->strs.at(1)] {
                         std::string why, proof;
                         const bool ok = auth->verify("store", *nonce, store_nonce, store_proof, why);
                         if (ok) proof = auth->proof("agent", *nonce, store_nonce);
                         asio::post(io, [&, p, ok, why, proof, shaken_one] {
                           if (!ok) {
                             round.error = "AUTH: the store's proof: " + why;
                             return io.stop();
                           }
                           p->call(Request{.op = Op::kAuth, .values = {proof}, .number = 2}, Reply::kU8,
                                   [&, p, shaken_one] {
                                     if (p->num != 1) round.error = "AUTH refused";
                                     shaken_one();
                                   });
                         });
                       });
          },
          2);
    };
    p->call(
        Request{.op = Op::kValidate, .number = rdzv::kValidationMagic}, Reply::kNone,
        [&, p, authenticate] { p->call(Request{.op = Op::kPing, .number = 7}, Reply::kU32, authenticate); });
  }
  io.run();
  io.restart();
  const double handshake_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - handshakes_began).count();
  const auto stats1 = server.stats();
  const nlohmann::json probe_ms = probe.stop();
  const double thread0 = cpu_ms(CLOCK_THREAD_CPUTIME_ID);
  round.on_all_returned = [&] { deadline.cancel(); };
  for (auto& node : nodes) node->run();
  if (shaken == n) io.run();
  const double clients_cpu = cpu_ms(CLOCK_THREAD_CPUTIME_ID) - thread0;
  const auto stats2 = server.stats();
  const double store_cpu = stats2.cpu_ms - stats1.cpu_ms;

  std::string error = !round.error.empty() ? round.error : shaken < n ? "the handshakes did not finish" : "";
  if (error.empty()) error = verify(nodes);
  nlohmann::json out = {{"nodes", n}, {"min_nodes", min}, {"max_nodes", n}, {"simulation", "replay"}};
  if (round.returned == n) {
    Clock::time_point first = nodes[0]->t0, last_start = first, first_done = nodes[0]->t1, last = first_done;
    for (const auto& node : nodes) {
      first = std::min(first, node->t0);
      last_start = std::max(last_start, node->t0);
      first_done = std::min(first_done, node->t1);
      last = std::max(last, node->t1);
    }
    auto ms = [&](Clock::time_point t) {
      return std::chrono::duration<double, std::milli>(t - first).count();
    };
    out["wall_ms"] = ms(last);
    out["phases_ms"] = {{"last_node_started", ms(last_start)},
                        {"first_node_returned", ms(first_done)},
                        {"last_node_returned", ms(last)}};
  }
  out["requests_round"] = stats2.requests - stats1.requests;
  out["requests_per_node"] = static_cast<double>(stats2.requests - stats1.requests) / n;
  out["connections"] = stats1.connections;
  out["cpu_ms"] = {{"store", store_cpu},
                   {"clients", clients_cpu},
                   {"store_handshake", stats1.cpu_ms - stats0.cpu_ms},
                   {"store_io_thread", stats1.io_thread_cpu_ms - stats0.io_thread_cpu_ms}};
  out["handshake_ms"] = handshake_ms;
  out["probe_ms"] = probe_ms;
  out["secret"] = secret;
  out["munge"] = !munge_socket.empty();
  out["ok"] = error.empty();
  if (!error.empty()) out["error"] = error;
  std::cout << out.dump() << std::endl;
  return error.empty() ? 0 : 1;
}

}  // namespace
}  // namespace ddprun::bench

int main(int argc, char** argv) {
  CLI::App app{"ddprun-rendezvous-replay: DynamicRendezvous's requests for N nodes from one client thread"};
  int nodes = 64, min = 0;
  double timeout_s = 120;
  bool secret = false;
  std::string munge_socket;
  app.add_option("--nodes", nodes, "Simulated nodes (max_nodes)")->check(CLI::Range(1, 100000));
  app.add_option("--min", min, "min_nodes (default: = --nodes)")->check(CLI::Range(0, 100000));
  app.add_option("--timeout", timeout_s, "Deadline of the whole run, seconds")->check(CLI::PositiveNumber);
  app.add_flag("--secret", secret, "The store requires the job's secret; every connection does AUTH first");
  app.add_option(
      "--munge-socket", munge_socket,
      "The store requires MUNGE credentials through the munged at this socket (instead of --secret)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (min == 0) min = nodes;
  if (min > nodes) {
    std::cerr << "ddprun-rendezvous-replay: --min must not exceed --nodes\n";
    return 2;
  }
  try {
    return ddprun::bench::run(nodes, min, timeout_s, secret, munge_socket);
  } catch (const std::exception& e) {
    std::cerr << "ddprun-rendezvous-replay: " << e.what() << "\n";
    return 1;
  }
}
