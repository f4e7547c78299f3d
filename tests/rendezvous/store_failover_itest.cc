// StoreFailover's standby store (rendezvous/c10d/store_failover.h) on loopback: it listens on its listed
// port, or nowhere. Whoever holds a listed port (another agent of the host, a stranger on a shared host)
// would otherwise be where the job looks for this node's standby, able to relay the job's handshakes
// (docs/security.md, "What is not protected").
#include <chrono>
#include <string>

#include "catch_compat.h"
#include "rendezvous/c10d/store_failover.h"
#include "rendezvous/round_keys.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"

namespace ddprun::rdzv {
namespace {

using namespace std::chrono_literals;

TEST_CASE("store failover: a standby never moves off its listed port", "[rendezvous][failover]") {
  // Someone else listens on the port this host's entry of --rdzv_endpoint names.
  StoreServerThread holder(StoreServerOptions{.host = "127.0.0.1"});
  StoreFailover failover(RoundKeys("job"), 1s, 1s);
  failover.start_standby("127.0.0.1", holder.port(), 0, "127.0.0.1");
  CHECK(failover.standby().empty());  // no standby at all, and no other port advertised

  // A free listed port is the standby's, and it answers there.
  uint16_t free_port = 0;
  {
    StoreServerThread probe(StoreServerOptions{.host = "127.0.0.1"});
    free_port = probe.port();
  }
  StoreFailover other(RoundKeys("job"), 1s, 1s);
  other.start_standby("127.0.0.1", free_port, 0, "127.0.0.1");
  CHECK(other.standby() == "127.0.0.1:" + std::to_string(free_port));
  StoreClient c("127.0.0.1", free_port, StoreClientOptions{.connect_timeout = 5s, .timeout = 5s});
  CHECK(c.check({"ddprun/job/standby"}));

  // Without a listed port: any free port (nobody looks for it there but the job's successors list).
  StoreFailover unlisted(RoundKeys("job"), 1s, 1s);
  unlisted.start_standby("127.0.0.1", 0, 0, "127.0.0.1");
  CHECK_FALSE(unlisted.standby().empty());
}

}  // namespace
}  // namespace ddprun::rdzv
