// Integration tests of StaticRendezvous: the nodes of one job as threads of this process (and, where agents
// must be told apart by their identity "<hostname>:<pid>", a forked child) against node 0's store on
// 127.0.0.1, port 0. Waits are on futures and store keys with deadlines; every wait is bounded by kLimit.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/static_rendezvous.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous_participants.h"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;
using namespace testing;

// Node 0 hosts the store on a free port of 127.0.0.1; the others connect to it.
StaticRendezvousOptions static_node(uint16_t port, int node_rank, int nnodes) {
  StaticRendezvousOptions o;
  o.run_id = kRunId;
  o.node_rank = node_rank;
  o.nnodes = nnodes;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.host_store = node_rank == 0;
  o.bind_host = "127.0.0.1";
  o.join_timeout = kLimit;
  o.connect_timeout = 5s;
  o.progress_interval = 50ms;
  return o;
}

using Node = testing::Participant<StaticRendezvous>;

// Runs `body` in a forked child (another pid: another agent identity); returns what it wrote and its exit
// code. The child is killed at kLimit; nothing outlives the call.
template <typename Body>
std::pair<int, std::string> in_child(Body body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string text;
    int code = body(text);
    (void)!::write(fds[1], text.data(), text.size());
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string out;
  auto deadline = Clock::now() + kLimit;
  while (Clock::now() < deadline) {
    pollfd p{fds[0], POLLIN, 0};
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (::poll(&p, 1, std::max(left, 1)) <= 0) break;
    char buf[4096];
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  ::kill(pid, SIGKILL);  // a no-op when it already exited (not yet reaped: the pid is still its own)
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

}  // namespace

TEST_CASE("static rendezvous: the nodes meet, ranks follow node ranks, rounds stop and restart together",
          "[static][integration]") {
  Node n0(static_node(0, 0, 3));
  const uint16_t port = n0.rdzv->store_port();
  REQUIRE(port != 0);
  Node n1(static_node(port, 1, 3));
  Node n2(static_node(port, 2, 3));
  n2.join(3);
  n1.join(1);
  n0.join(2);
  RendezvousInfo i0 = n0.info(), i1 = n1.info(), i2 = n2.info();
  for (const auto* i : {&i0, &i1, &i2}) {
    CHECK(i->round == 0);
    CHECK(i->group_world_size == 3);
    CHECK(i->world_size == 6);
    CHECK(i->store_host == "127.0.0.1");
    CHECK(i->store_port == port);
  }
  CHECK(i0.group_rank == 0);
  CHECK(i0.base_rank == 0);
  CHECK(i1.group_rank == 1);
  CHECK(i1.base_rank == 2);
  CHECK(i2.group_rank == 2);
  CHECK(i2.base_rank == 3);
  StoreClient obs("127.0.0.1", port, observer_options());
  CHECK(obs.get("ddprun/worker_keyspace") == kRunId + "/r0");

  // A worker fails on node 1: the first stop wins, every node learns it.
  RoundStop failed{RoundStop::Kind::kFailed, 1, "rank 2 exited with 3", 3};
  CHECK(n1.rdzv->stop_round(failed).kind == RoundStop::Kind::kFailed);
  RoundStop later = n2.rdzv->stop_round(RoundStop{RoundStop::Kind::kShutdown, 2, "SIGTERM", 143});
  CHECK(later.kind == RoundStop::Kind::kFailed);
  CHECK(later.detail == failed.detail);
  for (auto* n : {&n0, &n1, &n2}) {
    auto s = n->rdzv->wait_round_stopped(kLimit);
    REQUIRE(s);
    CHECK(s->kind == RoundStop::Kind::kFailed);
    CHECK(s->exit_code == 3);
  }

  // Every node joins the next round; its workers get a fresh keyspace.
  n0.join(2);
  n1.join(1);
  n2.join(3);
  CHECK(n0.info().round == 1);
  CHECK(n1.info().round == 1);
  CHECK(n2.info().round == 1);
  CHECK(obs.get("ddprun/worker_keyspace") == kRunId + "/r1");

  n0.rdzv->node_done();
  n1.rdzv->node_done();
  CHECK_FALSE(n2.rdzv->wait_round_stopped(0ms));
  n2.rdzv->node_done();
  auto done = n0.rdzv->wait_round_stopped(kLimit);
  REQUIRE(done);
  CHECK(done->kind == RoundStop::Kind::kDone);
  CHECK(done->node_rank == 2);

  n0.rdzv->set_closed();
  Node late(static_node(port, 1, 3));
  REQUIRE_THROWS_AS(late.rdzv->next_rendezvous(1), RendezvousClosedError);
  n1.rdzv->shutdown();
  n2.rdzv->shutdown();
  CHECK_FALSE(obs.check({rkey(1, "left_all")}));
  n0.rdzv->shutdown();  // the host: returns once every node left
}

TEST_CASE(
    "static rendezvous: a second agent with a node rank already taken is refused, naming the agent holding "
    "it",
    "[static][integration]") {
  Node n0(static_node(0, 0, 2));
  const uint16_t port = n0.rdzv->store_port();
  Node n1(static_node(port, 1, 2));
  StoreClient obs("127.0.0.1", port, observer_options());
  n1.join(1);
  REQUIRE(eventually([&] { return obs.add(rkey(0, "joined"), 0) == 1; }));
  const std::string holder = obs.get(rkey(0, "node/1"));

  // Another agent (another process) started with --node_rank 1 as well.
  auto [code, text] = in_child([&](std::string& out) {
    try {
      StaticRendezvous dup(static_node(port, 1, 2));
      dup.next_rendezvous(1);
      out = "joined";
      return 1;
    } catch (const RendezvousConflictError& e) {  // not "closed": the job runs, this agent is wrong
      out = e.what();
      return 0;
    } catch (const std::exception& e) {
      out = e.what();
      return 2;
    }
  });
  INFO(text);
  CHECK(code == 0);
  CHECK_THAT(text, Catch::Contains("--node_rank 1 is already taken by agent " + holder));
  CHECK_THAT(text, Catch::Contains("give every node a distinct --node_rank in 0..1"));
  CHECK(obs.add(rkey(0, "joined"), 0) == 1);  // the refused agent was not counted

  n0.join(1);  // the round completes with the real node 1
  CHECK(n0.info().group_world_size == 2);
  CHECK(n1.info().group_rank == 1);
}

TEST_CASE("static rendezvous: node 0 giving up at its join timeout is a join timeout on the other nodes",
          "[static][integration]") {
  auto o0 = static_node(0, 0, 3);
  o0.join_timeout = 500ms;
  Node n0(o0);
  const uint16_t port = n0.rdzv->store_port();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  Node n2(static_node(port, 2, 3));  // join_timeout kLimit: it must not be what ends its wait
  StoreClient obs("127.0.0.1", port, observer_options());
  n2.join(1);
  REQUIRE(eventually([&] { return obs.add(rkey(0, "joined"), 0) == 1; }));
  auto start = Clock::now();
  n0.join(1);
  REQUIRE(n0.ready());
  try {
    n0.round.get();
    FAIL("the round completed with 2 of 3 nodes");
  } catch (const RendezvousTimeoutError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Contains("only 2 of 3 nodes joined"));
    CHECK_THAT(e.what(), Catch::Contains(endpoint + "; missing node ranks: 1."));
  }
  // Node 0's agent exits, and the store with it.
  obs.close();
  n0.rdzv.reset();

  REQUIRE(n2.ready());
  CHECK(Clock::now() - start < kLimit / 2);  // reported when the store left, not at its own deadline
  try {
    n2.round.get();
    FAIL("the round completed without its store");
  } catch (const RendezvousTimeoutError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Contains("rendezvous 'job' round 0"));
    CHECK_THAT(e.what(), Catch::Contains("the store at " + endpoint + " (node 0's agent) went away"));
    CHECK_THAT(e.what(), Catch::Contains(" of 3 had joined"));
  }
}

}  // namespace ddprun::rdzv
