// Unit tests for agent/observe/event_log.h: torch's event lines, byte for byte. The expected lines were
// printed by torch's own Event.serialize() (torch.distributed.elastic.events.api, 2.6) for the metadata that
// torch's SimpleElasticAgent._construct_event builds; error files go to a fresh temporary directory.
#include "agent/observe/event_log.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "agent/observe/job_events.h"  // worker_status_events
#include "catch_compat.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace ddprun::agent;

namespace {

using ddprun::testing::TempDir;

StatusEvent agent_fields() {
  return StatusEvent{.run_id = "job-1",
                     .role = "trainer",
                     .hostname = "node-a.example.com",
                     .rdzv_backend = "c10d",
                     .entry_point = "python3"};
}

// A torch error file (json.dump of its record) with a non-ASCII character, quotes and a newline.
const char* kErrorFile =
    R"({"message": {"message": "RuntimeError: caf\u00e9 \"x\"\n", "extraInfo": {"timestamp": "1700000000", )"
    R"("py_callstack": "Traceback"}}})";

}  // namespace

TEST_CASE("event_log: a RENDEZVOUS event of the first round, as torch prints it", "[agent][event_log]") {
  StatusEvent e = agent_fields();
  e.state = "RENDEZVOUS";
  e.duration_ms = 12.5;
  CHECK(
      status_event_json(e) ==
      R"({"name": "torchelastic.worker.status.RENDEZVOUS", "source": "AGENT", "timestamp": 0, "metadata": )"
      R"({"run_id": "job-1", "global_rank": null, "group_rank": null, "worker_id": null, "role": "trainer", )"
      R"("hostname": "node-a.example.com", "state": "RENDEZVOUS", "total_run_time": 0, "rdzv_backend": "c10d", )"
      R"("raw_error": null, "metadata": "{\"group_world_size\": null, \"entry_point\": \"python3\"}", )"
      R"("agent_restarts": 0, "duration_ms": 12.5}})");
}

TEST_CASE("event_log: a FAILED worker event with its error file as raw_error", "[agent][event_log]") {
  TempDir dir;
  std::ofstream(dir.path / "error.json") << kErrorFile;
  StatusEvent e = agent_fields();
  e.state = "FAILED";
  e.from_worker = true;
  e.group_rank = 1;
  e.group_world_size = 2;
  e.total_run_time = 7;
  e.agent_restarts = 1;
  e.raw_error = error_file_json(dir.path / "error.json");
  e.worker = StatusEvent::WorkerFields{.global_rank = 3,
                                       .local_rank = 1,
                                       .role_rank = 3,
                                       .role_world_size = 4,
                                       .worker_id = 4242,
                                       .exit_code = -9,
                                       .worker_pid = 4242};
  CHECK(
      status_event_json(e) ==
      R"({"name": "torchelastic.worker.status.FAILED", "source": "WORKER", "timestamp": 0, "metadata": )"
      R"({"run_id": "job-1", "global_rank": 3, "group_rank": 1, "worker_id": "4242", "role": "trainer", )"
      R"("hostname": "node-a.example.com", "state": "FAILED", "total_run_time": 7, "rdzv_backend": "c10d", )"
      R"("raw_error": "{\"message\": {\"message\": \"RuntimeError: caf\\u00e9 \\\"x\\\"\\n\", \"extraInfo\": )"
      R"({\"timestamp\": \"1700000000\", \"py_callstack\": \"Traceback\"}}}", "metadata": )"
      R"("{\"group_world_size\": 2, \"entry_point\": \"python3\", \"local_rank\": [1], \"role_rank\": [3], )"
      R"(\"role_world_size\": [4], \"exit_code\": [-9], \"worker_pid\": [4242]}", "agent_restarts": 1, )"
      R"("duration_ms": null}})");
}

TEST_CASE("event_log: raw_error is json.dumps of the error file, or of torch's <NONE> record",
          "[agent][event_log]") {
  TempDir dir;
  std::ofstream(dir.path / "compact.json")
      << R"({"message":{"message":"boom","extraInfo":{"timestamp":"1"}}})";
  CHECK(error_file_json(dir.path / "compact.json") ==
        R"({"message": {"message": "boom", "extraInfo": {"timestamp": "1"}}})");
  CHECK(error_file_json(dir.path / "missing.json") == R"({"message": "<NONE>"})");
  std::ofstream(dir.path / "garbage.json") << "not json";
  CHECK(error_file_json(dir.path / "garbage.json") == R"({"message": "<NONE>"})");
}

TEST_CASE("event_log: worker events of a group: SUCCEEDED, or FAILED and TERMINATED", "[agent][event_log]") {
  TempDir dir;
  WorkerGroup group;
  group.round.world_size = 4;
  for (int lr = 0; lr < 2; ++lr) {
    Worker w;
    w.local_rank = lr;
    w.rank = 2 + lr;
    w.pid = 100 + lr;
    w.paths.error_file = dir.path / ("error" + std::to_string(lr) + ".json");
    group.workers.push_back(w);
  }
  StatusEvent base = agent_fields();
  base.group_rank = 1;
  base.group_world_size = 2;

  auto ok = worker_status_events(group, true, base);
  REQUIRE(ok.size() == 2);
  CHECK(ok[1].state == "SUCCEEDED");
  CHECK(ok[1].from_worker);
  CHECK(ok[1].worker->global_rank == 3);
  CHECK(ok[1].worker->role_world_size == 4);
  CHECK(ok[1].worker->worker_id == 101);
  CHECK_FALSE(ok[1].worker->exit_code);
  CHECK_FALSE(ok[1].raw_error);

  group.workers[0].state = WorkerState::kFailed;
  group.workers[0].status.signal = 11;
  group.workers[1].state = WorkerState::kStopped;
  auto failed = worker_status_events(group, false, base);
  REQUIRE(failed.size() == 2);
  CHECK(failed[0].state == "FAILED");
  CHECK(failed[0].worker->exit_code == -11);
  CHECK(failed[0].worker->worker_pid == 100);
  CHECK(failed[0].raw_error == R"({"message": "<NONE>"})");
  CHECK(failed[1].state == "TERMINATED");
  CHECK_FALSE(failed[1].worker->exit_code);
  CHECK_FALSE(failed[1].raw_error);
}

TEST_CASE("event_log: the console handler prints unless LOGLEVEL is WARNING or above", "[agent][event_log]") {
  CHECK(events_printed(EventLogHandler::kConsole, nullptr));
  CHECK(events_printed(EventLogHandler::kConsole, "INFO"));
  CHECK(events_printed(EventLogHandler::kConsole, "DEBUG"));
  CHECK_FALSE(events_printed(EventLogHandler::kConsole, "WARNING"));
  CHECK_FALSE(events_printed(EventLogHandler::kConsole, "ERROR"));
  CHECK_FALSE(events_printed(EventLogHandler::kNull, nullptr));
  CHECK_FALSE(events_printed(EventLogHandler::kDynamicRendezvous, "INFO"));
}
