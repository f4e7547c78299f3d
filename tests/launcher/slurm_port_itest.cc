// launcher/slurm/slurm_port.h on 127.0.0.1: agent 0 takes the first candidate it can bind; the other agents find
// the candidate whose store carries their step token, skipping ports held by another job's store or by a
// program that is no store at all. Candidate ports are ports that were free a moment ago (bound to port 0).
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <future>
#include <utility>

#include "catch_compat.h"
#include "launcher/slurm/slurm_env.h"
#include "launcher/slurm/slurm_port.h"
#include "rendezvous/auth/hmac_auth.h"
#include "rendezvous/static_rendezvous.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"

namespace {

using namespace ddprun;
using std::chrono::milliseconds;

// A port nobody listens on now.
uint16_t free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

std::unique_ptr<rdzv::RendezvousHandler> hosting(uint16_t port) {
  rdzv::StaticRendezvousOptions o;
  o.run_id = "slurm-port-itest";
  o.master_addr = "127.0.0.1";
  o.bind_host = "127.0.0.1";
  o.master_port = port;
  o.host_store = true;
  o.connect_timeout = milliseconds(5000);
  return std::make_unique<rdzv::StaticRendezvous>(o);
}

// Another job's ddprun store: listens and carries that job's token.
struct ForeignStore {
  explicit ForeignStore(const std::string& token) : server(rdzv::StoreServerOptions{.host = "127.0.0.1"}) {
    rdzv::StoreClient("127.0.0.1", server.port()).set(launcher::kSlurmStepKey, token);
  }
  rdzv::StoreServerThread server;
};

}  // namespace

TEST_CASE("agent 0 skips a taken port and the others find its store, not another job's") {
  ForeignStore other("41.0");
  const uint16_t taken = other.server.port(), free1 = free_port();
  std::vector<uint16_t> ports = {taken, free1};
  auto hosted = launcher::host_on_first_free_port("127.0.0.1", ports, "42.0", hosting);
  REQUIRE(hosted.rendezvous);
  CHECK(hosted.port == free1);
  CHECK(launcher::find_step_store("127.0.0.1", ports, "42.0", milliseconds(20000)) == free1);
  // The other job's agents still find theirs.
  CHECK(launcher::find_step_store("127.0.0.1", ports, "41.0", milliseconds(20000)) == taken);
}

TEST_CASE("a program that is no store on a candidate port is skipped") {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor silent(io,
                                        {boost::asio::ip::make_address("127.0.0.1"), 0});  // never answers
  const uint16_t busy = silent.local_endpoint().port(), next = free_port();
  auto hosted = launcher::host_on_first_free_port("127.0.0.1", {busy, next}, "7.1", hosting);
  CHECK(hosted.port == next);
  CHECK(launcher::find_step_store("127.0.0.1", {busy, next}, "7.1", milliseconds(30000)) == next);
}

TEST_CASE("agents that start before agent 0 keep looking until its store appears") {
  std::vector<uint16_t> ports = {free_port(), free_port()};
  auto finder = std::async(std::launch::async, [&] {
    return launcher::find_step_store("127.0.0.1", ports, "9.0", milliseconds(30000));
  });
  auto hosted = launcher::host_on_first_free_port("127.0.0.1", ports, "9.0", hosting);
  CHECK(finder.get() == hosted.port);
}

TEST_CASE("no store of the step before the deadline: a timeout naming host, token and ports") {
  ForeignStore other("1.0");
  std::vector<uint16_t> ports = {other.server.port(), free_port()};
  try {
    // 3 s: several sweeps, so that the other step's store is seen answering even on a busy machine (a probe
    // that times out keeps what an earlier one found).
    launcher::find_step_store("127.0.0.1", ports, "2.0", milliseconds(3000));
    FAIL("found a store that does not exist");
  } catch (const rdzv::TimeoutError& e) {
    std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("no store of Slurm step 2.0 on 127.0.0.1") &&
                         Catch::Contains(std::to_string(ports[0]) + ": store of step 1.0") &&
                         Catch::Contains(std::to_string(ports[1]) + ": "));
  }
}

TEST_CASE("agent 0 fails with a BindError naming every candidate when all are taken") {
  ForeignStore a("1.0"), b("1.1");
  std::vector<uint16_t> ports = {a.server.port(), b.server.port()};
  try {
    launcher::host_on_first_free_port("127.0.0.1", ports, "3.0", hosting);
    FAIL("bound a taken port");
  } catch (const rdzv::BindError& e) {
    CHECK_THAT(std::string(e.what()),
               Catch::Contains(launcher::format_ports(ports)) && Catch::Contains("--master_port"));
  }
}

TEST_CASE("with the job's authentication, the others find its store past another job's that refuses them") {
  auto ours = std::make_shared<rdzv::HmacAuth>("our-job-secret-0123456789");
  auto theirs = std::make_shared<rdzv::HmacAuth>("their-job-secret-0123456789");
  rdzv::StoreServerOptions foreign;
  foreign.host = "127.0.0.1";
  foreign.auth = theirs;
  rdzv::StoreServerThread other(foreign);
  rdzv::StoreClientOptions as_them;
  as_them.auth = theirs;
  rdzv::StoreClient("127.0.0.1", other.port(), as_them)
      .set(launcher::kSlurmStepKey, "5.0");  // even our token
  const std::vector<uint16_t> ports = {other.port(), free_port()};
  auto hosting_ours = [&](uint16_t port) -> std::unique_ptr<rdzv::RendezvousHandler> {
    rdzv::StaticRendezvousOptions o;
    o.run_id = "slurm-port-itest";
    o.master_addr = o.bind_host = "127.0.0.1";
    o.master_port = port;
    o.host_store = true;
    o.connect_timeout = milliseconds(5000);
    o.auth = ours;
    return std::make_unique<rdzv::StaticRendezvous>(o);
  };
  auto hosted = launcher::host_on_first_free_port("127.0.0.1", ports, "5.0", hosting_ours, ours);
  REQUIRE(hosted.rendezvous);
  CHECK(hosted.port == ports[1]);
  CHECK(launcher::find_step_store("127.0.0.1", ports, "5.0", milliseconds(20000), ours) == ports[1]);
  // Without the job's authentication its store admits no probe: nothing is found.
  CHECK_THROWS_AS(launcher::find_step_store("127.0.0.1", {ports[1]}, "5.0", milliseconds(1500)),
                  rdzv::TimeoutError);
}
