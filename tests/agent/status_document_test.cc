// The status documents (agent/observe/status_document.h): what the agent writes reads back field for field;
// what a stranger writes into an open store is read tolerantly — the wrong types and entries are skipped and
// named, nothing throws — and the straggler report made from such documents goes on (StragglerWatch).
#include "agent/observe/status_document.h"

#include <nlohmann/json.hpp>

#include "agent/observe/straggler_watch.h"
#include "catch_compat.h"
#include "rendezvous/util/text_util.h"

using namespace ddprun::agent;
using json = nlohmann::json;

namespace {

StatusDocument running_node(int node_rank, double slow_rank_s) {
  StatusDocument d{.host = "h" + std::to_string(node_rank),
                   .pid = 4000 + node_rank,
                   .backend = "c10d",
                   .state = "running",
                   .time = 1.0e9,
                   .round = 1,
                   .node_rank = node_rank,
                   .nodes = 2,
                   .base_rank = 2 * node_rank,
                   .world_size = 4,
                   .local_world_size = 2,
                   .restarts_used = 1,
                   .restarts_max = 3};
  for (int lr = 0; lr < 2; ++lr) {
    d.ranks.push_back(RankStatus{.rank = 2 * node_rank + lr,
                                 .local_rank = lr,
                                 .pid = 100 + lr,
                                 .state = "running",
                                 .progress_age_s = 0.5,
                                 .step = 0,
                                 .step_time_s = 0.2,
                                 .before_collective_s = lr == 1 ? slow_rank_s : 0.05});
  }
  return d;
}

// The document of the review's reproduction: the current round, one plausible rank entry, a number as host.
std::string strangers_document() {
  return json{
      {"v", 1},
      {"host", 42},
      {"round", 1},
      {"node_rank", "zero"},
      {"ranks",
       {{{"rank", 9}, {"step", 7}, {"before_collective_s", 5.0}, {"pid", "x"}, {"state_step", "soon"}},
        "not a rank",
        {{"rank", -3}}}}}
      .dump();
}

}  // namespace

TEST_CASE("status document: what the agent writes reads back", "[agent][status]") {
  const StatusDocument d = running_node(1, 0.3);
  std::vector<std::string> problems;
  const auto back = read_status_document(status_document_text(d), problems);
  REQUIRE(back);
  CHECK(problems.empty());
  CHECK(back->host == "h1");
  CHECK(back->pid == 4001);
  CHECK(back->round == 1);
  CHECK(back->node_rank == 1);
  CHECK(back->local_world_size == 2);
  CHECK(back->restarts_max == 3);
  REQUIRE(back->ranks.size() == 2);
  CHECK(back->ranks[1].rank == 3);
  CHECK(back->ranks[1].before_collective_s == 0.3);
  CHECK(back->ranks[1].step == 0u);
  CHECK_FALSE(back->state_bytes);  // no --state_memory
  CHECK_FALSE(back->ranks[1].state_step);
  // --state_memory's figures.
  StatusDocument kept = d;
  kept.state_bytes = uint64_t{5} << 30;
  kept.ranks[1].state_step = 1200;
  kept.ranks[1].state_replica_step = 1190;
  const auto k = read_status_document(status_document_text(kept), problems);
  REQUIRE(k);
  CHECK(problems.empty());
  CHECK(k->state_bytes == uint64_t{5} << 30);
  CHECK(k->ranks[1].state_step == 1200);
  CHECK(k->ranks[1].state_replica_step == 1190);
  CHECK_FALSE(k->ranks[0].state_replica_step);
  // Unknown values are written as null and read back as unknown.
  StatusDocument forming{.host = "h2", .state = "forming"};
  const auto f = read_status_document(status_document_text(forming), problems);
  REQUIRE(f);
  CHECK(problems.empty());
  CHECK_FALSE(f->round);
  CHECK(f->ranks.empty());
}

TEST_CASE("status document: a stranger's document is read as far as it can be, never thrown on",
          "[agent][status]") {
  std::vector<std::string> problems;
  const auto d = read_status_document(strangers_document(), problems);
  REQUIRE(d);
  CHECK(d->host.empty());
  CHECK(d->round == 1);
  CHECK_FALSE(d->node_rank);
  REQUIRE(d->ranks.size() == 1);  // the plausible entry; "not a rank" and a negative rank skipped
  CHECK(d->ranks[0].rank == 9);
  CHECK_FALSE(d->ranks[0].pid);
  const std::string said = ddprun::join(problems, "; ");
  CHECK_THAT(said, Catch::Contains("\"host\" is not a string") && Catch::Contains("\"node_rank\" is not") &&
                       Catch::Contains("ranks[1] is not an object") &&
                       Catch::Contains("ranks[2] has no rank") &&
                       Catch::Contains("ranks[0]: \"pid\" is not an integer") &&
                       Catch::Contains("ranks[0]: \"state_step\" is not an integer"));

  for (const char* text : {"", "[1,2]", "null", "{\"ranks\": 5}", "{\"ranks\": [[]], \"time\": \"soon\"}",
                           "{\"round\": 1e30, \"restarts_used\": -1.5}", "\xff\xfe"}) {
    problems.clear();
    CHECK_NOTHROW(read_status_document(text, problems));
  }
}

TEST_CASE("straggler report: made from good documents beside a stranger's", "[agent][status]") {
  StragglerWatch watch(1.5);
  std::optional<std::string> report;
  std::vector<StragglerEpisode> flagged;
  auto now = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  int samples = 0;
  for (int step = 1; step <= 10 && flagged.empty(); ++step, now += std::chrono::seconds(4)) {
    StatusDocument a = running_node(0, 0.05), b = running_node(1, 0.5);
    for (auto* d : {&a, &b})
      for (auto& r : d->ranks) r.step = step;
    CHECK_FALSE(watch.due(1, 1, 2, now));  // only node rank 0 compares
    REQUIRE(watch.due(1, 0, 2, now));
    CHECK_FALSE(watch.due(1, 0, 2, now + std::chrono::seconds(1)));  // every 3.9 s
    const std::vector<std::string> docs{status_document_text(a), strangers_document(),
                                        status_document_text(b), "{not json"};
    CHECK_NOTHROW(flagged = watch.observe(docs, 2, report));
    ++samples;
  }
  CHECK(samples == 5);  // the tracker's window
  REQUIRE(flagged.size() == 1);
  CHECK(flagged[0].rank == 3);
  CHECK(flagged[0].host == "h1");
  REQUIRE(report);
  std::vector<std::string> problems;
  const auto r = read_straggler_report(*report, problems);
  REQUIRE(r);
  CHECK(problems.empty());
  CHECK(r->round == 1);
  REQUIRE(r->ranks.size() == 1);
  CHECK(r->ranks[0].rank == 3);
}
