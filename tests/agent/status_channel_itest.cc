// StatusChannel (agent/observe/status_channel.h) against real stores on 127.0.0.1: the agent loop's post
// never waits for the store — a store that accepts and never answers holds up only the channel's thread — and
// the documents reach the store, registered once per store (again in the store a failover moved the job to).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "agent/observe/status_channel.h"
#include "agent/observe/status_document.h"
#include "catch_compat.h"
#include "rendezvous/round_keys.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/util/unique_fd.h"

using namespace ddprun;
using namespace std::chrono_literals;

namespace {

// A TCP port on 127.0.0.1 that accepts connections (the kernel's backlog) and never reads or answers: a
// frozen store.
struct SilentListener {
  SilentListener() : fd(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd.get(), 16) == 0);
    socklen_t n = sizeof a;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &n);
    port = ntohs(a.sin_port);
  }
  UniqueFd fd;
  uint16_t port = 0;
};

agent::StatusPost post_to(uint16_t port, const std::string& doc) {
  return agent::StatusPost{
      .access = {.host = "127.0.0.1", .port = port, .auth = nullptr, .run_id = "job9", .identity = "h0:1"},
      .document = doc};
}

}  // namespace

TEST_CASE("status channel: a store that never answers holds up only the channel's thread",
          "[agent][status]") {
  SilentListener frozen;
  agent::StatusChannel channel(0);
  channel.post(post_to(frozen.port, "{\"v\": 1}"));
  // The post returned; the publication is still waiting for the store's answer.
  CHECK_FALSE(channel.flush(100ms));
  channel.post(post_to(frozen.port, "{\"v\": 1, \"newer\": true}"));  // replaces what was not taken yet
  CHECK(channel.flush(10s));  // each request waits at most kObserverRequestTimeout, then gives up
}

TEST_CASE("status channel: documents reach the store, registered once per store", "[agent][status]") {
  rdzv::StoreServerThread first(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  rdzv::StoreClient reader("127.0.0.1", first.port());
  const rdzv::RoundKeys keys("job9");
  agent::StatusChannel channel(0);
  channel.post(post_to(first.port(), "{\"n\": 1}"));
  REQUIRE(channel.flush(10s));
  channel.post(post_to(first.port(), "{\"n\": 2}"));
  REQUIRE(channel.flush(10s));
  CHECK(keys.status_identities(reader) == std::vector<std::string>{"h0:1"});
  CHECK(keys.status_documents(reader, {"h0:1"}) == std::vector<std::string>{"{\"n\": 2}"});

  // The job moved to another store (a failover): the next document goes there, and the agent registers there.
  rdzv::StoreServerThread second(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  rdzv::StoreClient reader2("127.0.0.1", second.port());
  channel.post(post_to(second.port(), "{\"n\": 3}"));
  REQUIRE(channel.flush(10s));
  CHECK(keys.status_identities(reader2) == std::vector<std::string>{"h0:1"});
  CHECK(keys.status_documents(reader2, {"h0:1"}) == std::vector<std::string>{"{\"n\": 3}"});
}

TEST_CASE("status channel: node rank 0 removes the documents of agents that left the job long ago",
          "[agent][status]") {
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  rdzv::StoreClient c("127.0.0.1", server.port());
  const rdzv::RoundKeys keys("job9");
  auto publish = [&](const std::string& id, const std::string& doc, bool live) {
    bool registered = false;
    keys.publish_status(c, id, doc, registered);
    if (live) c.set(keys.key("live/" + id), "1");
  };
  auto doc = [](const std::string& backend, const std::string& state, int round, double time) {
    return agent::status_document_text(
        agent::StatusDocument{.host = "h",
                              .backend = backend,
                              .state = state,
                              .time = time,
                              .round = round >= 0 ? std::optional(round) : std::nullopt});
  };
  const double long_ago = 1.0e9,
               now =
                   std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  publish("done:1", doc("c10d", "done", 0, long_ago), false);         // finished long ago: goes
  publish("spare:2", doc("c10d", "forming", -1, long_ago), true);     // connected, waiting: stays
  publish("killed:3", doc("c10d", "running", 0, long_ago), false);    // its connection is gone: goes
  publish("static:4", doc("static", "running", 0, long_ago), false);  // not in the round, silent: goes
  publish("sick:5", doc("c10d", "unhealthy", -1, long_ago), false);   // retrying its health check: stays
  publish("recent:6", doc("c10d", "done", 0, now), false);            // left a moment ago: stays
  publish("junk:7", "{not json", false);                              // unreadable: shown, left
  agent::StatusChannel channel(0, 0ms);
  auto post = post_to(server.port(), doc("c10d", "running", 1, now));
  post.access.identity = "h0:1";
  post.round = 1;
  post.node_rank = 0;
  post.nodes = 1;
  channel.post(post);
  REQUIRE(channel.flush(10s));
  CHECK(keys.status_identities(c) ==
        std::vector<std::string>{"spare:2", "sick:5", "recent:6", "junk:7", "h0:1"});
  for (const char* gone : {"done:1", "killed:3", "static:4"})
    CHECK_FALSE(c.check({keys.key(std::string("status/") + gone)}));
  // Another node rank does not prune.
  publish("done:8", doc("c10d", "done", 0, long_ago), false);
  post.node_rank = 1;
  channel.post(post);
  REQUIRE(channel.flush(10s));
  CHECK(c.check({keys.key("status/done:8")}));
}
