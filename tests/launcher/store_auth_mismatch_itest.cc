// --rdzv_auth auto under Slurm (launcher/store_auth_setup.h, docs/security.md "Under Slurm") with real
// agents: two ddprun processes of one Slurm step on loopback (a static job of two nodes), each with a munged
// of its own choosing (DDPRUN_MUNGE_SOCKET): a private munged (private_munged.h) or none at all. The store's
// host decides for the job: when its munged fails, the job runs on an open store and every agent joins it;
// when another node's munged fails, that node alone ends with one message naming its munged. (Before, each
// node decided alone, and every agent across the mismatch exited 4.) Needs root and munged, like
// munge_auth_itest.cc.
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "child_processes.h"
#include "tests/rendezvous/auth/private_munged.h"

namespace {

using namespace std::chrono_literals;
using ddprun::testing::Child;

uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Node `rank` of a two-node Slurm step (job 4242) whose munged is at `munge_socket`.
Child agent(int rank, uint16_t port, const std::string& munge_socket) {
  const std::string r = std::to_string(rank);
  return ddprun::testing::spawn_child(
      {DDPRUN_BIN, "--slurm", "--nnodes", "2", "--node_rank", r, "--master_addr", "127.0.0.1",
       "--master_port", std::to_string(port), "--nproc_per_node", "1", "--no_python", "/bin/true"},
      {"SLURM_JOB_ID=4242", "SLURM_STEP_ID=0", "SLURM_PROCID=" + r, "SLURM_NODEID=" + r, "SLURM_LOCALID=0",
       "SLURM_NNODES=2", "SLURM_STEP_NUM_NODES=2", "SLURM_NTASKS=2", "SLURM_STEP_NUM_TASKS=2",
       "SLURM_STEP_TASKS_PER_NODE=1(x2)", "SLURM_STEP_NODELIST=localhost,127.0.0.1",
       "SLURM_JOB_NODELIST=localhost,127.0.0.1", "DDPRUN_MUNGE_SOCKET=" + munge_socket});
}

const std::string kNoMunged = "/nonexistent/munge.socket";

}  // namespace

TEST_CASE("rdzv_auth auto: the store's host's munged fails: every agent joins its open store, the job runs",
          "[launcher][auth][munge][integration]") {
  if (!ddprun::testing::can_run_munged()) return;
  ddprun::testing::PrivateMunged munged;
  const uint16_t port = free_port();
  std::vector<Child> nodes{agent(0, port, kNoMunged), agent(1, port, munged.socket())};
  ddprun::testing::wait_children(nodes, 120s);
  INFO("node 0:\n" << nodes[0].output << "\nnode 1:\n" << nodes[1].output);
  CHECK(nodes[0].exit_code == 0);
  CHECK(nodes[1].exit_code == 0);
  // One warning each, saying what happened: node 0's stores are open; node 1 joins an open store.
  CHECK_THAT(nodes[0].output, Catch::Contains("the stores this node hosts are open"));
  CHECK_THAT(nodes[1].output, Catch::Contains("is open") && Catch::Contains("this agent joins it"));
}

TEST_CASE("rdzv_auth auto: a node's munged fails while the store's host's works: that node ends, saying why",
          "[launcher][auth][munge][integration]") {
  if (!ddprun::testing::can_run_munged()) return;
  ddprun::testing::PrivateMunged munged;
  const uint16_t port = free_port();
  std::vector<Child> host{agent(0, port, munged.socket())};
  std::vector<Child> node{agent(1, port, kNoMunged)};
  ddprun::testing::wait_children(node, 120s);
  ::kill(-host[0].pid, SIGTERM);  // the store's host waits for the node that left; its end is not the subject
  ddprun::testing::wait_children(host, 60s);
  INFO("node 0:\n" << host[0].output << "\nnode 1:\n" << node[0].output);
  CHECK(node[0].exit_code == 4);
  CHECK_THAT(node[0].output, Catch::Contains("requires a MUNGE credential") &&
                                 Catch::Contains("its host decided so") && Catch::Contains(kNoMunged) &&
                                 Catch::Contains("start munged on this node"));
}
