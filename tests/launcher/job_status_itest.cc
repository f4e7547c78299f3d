// read_job_status (launcher/status/job_status.h) against a real ddprun store on 127.0.0.1: agents' status
// documents as agent/observe/status_report.h publishes them, their connection-bound live/ keys, the round's
// stop and the closed key, and what `ddprun status` derives from them.
#include <memory>

#include "catch_compat.h"
#include "launcher/status/job_status.h"
#include "rendezvous/round_keys.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"

using namespace ddprun;
using json = nlohmann::json;

namespace {

const std::string kRun = "job7";

json doc(const std::string& state, int round, int node_rank, int restarts_used, int caused) {
  json ranks = json::array();
  if (round >= 0) {
    for (int lr = 0; lr < 2; ++lr) {
      ranks.push_back({{"rank", 2 * node_rank + lr},
                       {"local_rank", lr},
                       {"pid", 100 + lr},
                       {"state", "running"},
                       {"progress_age_s", 0.5},
                       {"step", 42},
                       {"step_time_s", 0.125},
                       // node 1 reports its ranks' time before the first collective, node 0 does not
                       {"before_collective_s", node_rank == 1 ? json(lr == 1 ? 0.2 : 0.05) : json()}});
    }
  }
  auto null_or = [&](int v) { return round >= 0 ? json(v) : json(); };
  return {{"v", 1},
          {"host", "h" + std::to_string(node_rank)},
          {"pid", 4000 + node_rank},
          {"backend", "c10d"},
          {"state", state},
          {"detail", ""},
          {"time", 1.0e12},
          {"round", null_or(round)},
          {"node_rank", null_or(node_rank)},
          {"nodes", null_or(2)},
          {"local_world_size", 2},
          {"base_rank", null_or(2 * node_rank)},
          {"world_size", null_or(4)},
          {"restarts_used", restarts_used},
          {"restarts_max", 3},
          {"restarts_caused", caused},
          {"ranks", ranks}};
}

// One agent: its own connection, its live key, its status.
struct Agent {
  Agent(uint16_t port, const std::string& identity, const json& d) : id(identity), c("127.0.0.1", port) {
    const rdzv::RoundKeys keys(kRun);
    c.set(keys.key("live/" + id), "1");
    keys.publish_status(c, id, d.dump(), registered);
  }
  std::string id;
  rdzv::StoreClient c;
  bool registered = false;
};

}  // namespace

TEST_CASE("job status: a store without the job's agents says so", "[launcher][status]") {
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  rdzv::StoreClient reader("127.0.0.1", server.port());
  CHECK_THROWS_WITH(launcher::read_job_status(reader, kRun, "127.0.0.1:1"),
                    Catch::Contains("no agent of job 'job7'") && Catch::Contains("127.0.0.1:1"));
}

TEST_CASE("job status: running, restarting, lost and spare nodes, done", "[launcher][status]") {
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  const rdzv::RoundKeys keys(kRun);
  auto a = std::make_unique<Agent>(server.port(), "h0:4000", doc("running", 1, 0, 1, 1));
  Agent b(server.port(), "h1:4001", doc("running", 1, 1, 1, 0));
  Agent spare(server.port(), "h2:4002", doc("forming", -1, 2, 0, 0));
  rdzv::StoreClient reader("127.0.0.1", server.port());

  json s = launcher::read_job_status(reader, kRun, "h0:29400");
  CHECK(s["state"] == "running");
  CHECK(s["round"] == 1);
  CHECK(s["restarts"] == json{{"used", 1}, {"max", 3}});
  REQUIRE(s["nodes"].size() == 3);
  CHECK(s["nodes"][0]["identity"] == "h0:4000");  // by node rank, then the spare
  CHECK(s["nodes"][0]["ranks"] == json{0, 1});
  CHECK(s["nodes"][0]["restarts_caused"] == 1);
  CHECK(s["nodes"][2]["state"] == "spare");
  CHECK(s["nodes"][2]["node_rank"].is_null());
  REQUIRE(s["ranks"].size() == 4);
  CHECK(s["ranks"][3] == json{{"rank", 3},
                              {"node_rank", 1},
                              {"local_rank", 1},
                              {"host", "h1"},
                              {"pid", 101},
                              {"state", "running"},
                              {"progress_age_s", 0.5},
                              {"step", 42},
                              {"step_time_s", 0.125},
                              {"before_collective_s", 0.2},
                              {"straggler", false}});  // no report: nobody flagged
  CHECK(s["ranks"][0]["straggler"].is_null());         // no time: cannot be compared

  // Node rank 0's straggler report flags rank 3 in this round; one of an earlier round is ignored.
  keys.publish_stragglers(reader, json{{"v", 1}, {"round", 0}, {"ranks", {{{"rank", 2}}}}}.dump());
  s = launcher::read_job_status(reader, kRun, "h0:29400");
  CHECK(s["ranks"][2]["straggler"] == false);
  keys.publish_stragglers(reader,
                          json{{"v", 1}, {"round", 1}, {"ranks", {{{"rank", 3}, {"host", "h1"}}}}}.dump());
  s = launcher::read_job_status(reader, kRun, "h0:29400");
  CHECK(s["ranks"][3]["straggler"] == true);
  CHECK(s["ranks"][2]["straggler"] == false);
  CHECK(s["ranks"][1]["straggler"].is_null());
  const std::string table = launcher::status_table(s);
  CHECK_THAT(table, Catch::Contains("BEFORE COLLECTIVE") && Catch::Contains("STRAGGLER"));
  const std::string rank3 = table.substr(table.rfind("\n3 "));  // the last line: rank 3's
  CHECK_THAT(rank3, Catch::Contains("0.200 s") && Catch::EndsWith("yes\n"));
  CHECK_THAT(table,
             Catch::Contains(
                 "job job7 at h0:29400: running, round 1, restarts 1 of 3, 3 node(s), 4 rank(s), read at "));
  CHECK_THAT(table, Catch::Contains("spare"));
  CHECK_THAT(table, Catch::Contains("0.125 s"));

  // A node that stands aside as unhealthy deletes its own live key (c10d): it is unhealthy, not lost.
  Agent sick(server.port(), "h3:4003", doc("unhealthy", -1, 3, 0, 0));
  sick.c.delete_key(keys.key("live/h3:4003"));
  s = launcher::read_job_status(reader, kRun, "h0:29400");
  REQUIRE(s["nodes"].size() == 4);
  CHECK(s["nodes"][3]["identity"] == "h3:4003");
  CHECK(s["nodes"][3]["state"] == "unhealthy");

  // Agent a dies: its connection and live key go; the round is stopped.
  a.reset();
  keys.stop(reader, 1, rdzv::RoundStop{rdzv::RoundStop::Kind::kMembership, 1, "node 0 lost", 0});
  s = launcher::read_job_status(reader, kRun, "h0:29400");
  CHECK(s["state"] == "restarting");
  CHECK(s["nodes"][0]["state"] == "lost");

  // The job ends.
  keys.publish_status(b.c, b.id, doc("done", 1, 1, 1, 0).dump(), b.registered);
  keys.set_closed(reader);
  s = launcher::read_job_status(reader, kRun, "h0:29400");
  CHECK(s["state"] == "done");
  CHECK(s["nodes"][1]["state"] == "done");
  keys.publish_status(b.c, b.id, doc("failed", 1, 1, 1, 0).dump(), b.registered);
  CHECK(launcher::read_job_status(reader, kRun, "h0:29400")["state"] == "failed");
}

TEST_CASE("job status: a stranger's document is skipped where unreadable, the job shown",
          "[launcher][status]") {
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  Agent a(server.port(), "h0:4000", doc("running", 1, 0, 0, 0));
  Agent b(server.port(), "h1:4001", doc("running", 1, 1, 0, 0));
  // Anyone who reaches an open store: the current round, one plausible rank entry, a number as host.
  const json strangers = {{"v", 1},
                          {"host", 42},
                          {"state", "running"},
                          {"round", 1},
                          {"ranks", {{{"rank", 9}, {"step", 7}, {"pid", "x"}}, "junk"}}};
  Agent stranger(server.port(), "x:1", strangers);
  rdzv::StoreClient reader("127.0.0.1", server.port());
  rdzv::RoundKeys(kRun).publish_stragglers(reader, R"({"round": "one", "ranks": 7})");
  // An identity in the index without a document (a MULTI_GET of it would wait for it forever).
  const rdzv::RoundKeys keys(kRun);
  reader.set(keys.key("status/" + std::to_string(reader.add(keys.key("status/n"), 1) - 1)), "ghost:3");

  json s;
  REQUIRE_NOTHROW(s = launcher::read_job_status(reader, kRun, "h0:29400"));
  CHECK(s["state"] == "running");
  CHECK(s["nodes"].size() == 4);  // the ghost shows as unreadable
  CHECK(s["ranks"].size() == 5);  // the job's 4 and the stranger's plausible one
  const std::string skipped = s["skipped"].dump();
  CHECK_THAT(skipped, Catch::Contains("agent x:1: document: \\\"host\\\" is not a string") &&
                          Catch::Contains("ranks[1] is not an object") &&
                          Catch::Contains("straggler report: \\\"round\\\" is not an integer") &&
                          Catch::Contains("agent ghost:3: not a JSON object"));
  const std::string table = launcher::status_table(s);
  CHECK_THAT(table, Catch::Contains("4 node(s), 5 rank(s)"));
  CHECK_THAT(table, Catch::Contains("skipped, unreadable in the agents' documents"));

  // A document claiming a later round does not make the job's nodes spares where the store names the round
  // (the c10d closer's key).
  Agent liar(server.port(), "liar:2", {{"v", 1}, {"host", "x"}, {"state", "running"}, {"round", 999999}});
  s = launcher::read_job_status(reader, kRun, "h0:29400");
  CHECK(s["round"] == 999999);  // no round key (a static job's store): the newest a document names
  reader.set(rdzv::RoundKeys(kRun).key("round"), "1");
  s = launcher::read_job_status(reader, kRun, "h0:29400");
  CHECK(s["round"] == 1);
  CHECK(s["state"] == "running");
  CHECK(s["ranks"].size() == 5);
}
