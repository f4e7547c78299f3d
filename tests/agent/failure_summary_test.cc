// Unit tests of agent/failure_summary: reading torch's @record error files, choosing the root cause, and the
// summary, byte for byte against torch 2.6's own ChildFailedError text. The expected texts were printed by
// torch 2.6 (ChildFailedError(name, {rank: ProcessFailure(...)}), TZ=UTC, socket.getfqdn patched to
// "node1.example.com", error files with the same content as below); torch 1.13 prints the same.
// The error files are written to a fresh temporary directory; TZ is set to UTC for the times.
#include "agent/observe/failure_summary.h"

#include <stdlib.h>
#include <string.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "agent/process/worker_launch.h"  // signal_name
#include "catch_compat.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace ddprun::agent;

namespace {

using ddprun::testing::TempDir;

void utc() {
  ::setenv("TZ", "UTC", 1);
  ::tzset();
}

constexpr char kHost[] = "node1.example.com";
constexpr double kT0 = 1700000000;  // 2023-11-14_22:13:20 UTC

// A worker that exited without an error file (or was killed: signal != 0).
WorkerFailure exited(int rank, int local_rank, int pid, int exit_code, int signal, double time) {
  return WorkerFailure{.time = time,
                       .host = "node1",
                       .rank = rank,
                       .local_rank = local_rank,
                       .exit_code = exit_code,
                       .signal = signal,
                       .pid = pid};
}

// A worker whose error file (written to `dir`, shown as `shown_path`) had this JSON content, as the agent
// builds it (agent/loop/agent_actions.cc): message, traceback and time from the file.
WorkerFailure recorded(const TempDir& dir, int local_rank, int pid, const std::string& json,
                       const std::string& shown_path) {
  auto content = read_error_file(dir.write("e" + std::to_string(local_rank) + ".json", json));
  REQUIRE(content);
  WorkerFailure f = exited(local_rank, local_rank, pid, 1, 0, 0);
  f.error_file = shown_path;
  f.message = content->message;
  f.traceback = content->traceback;
  f.time = content->timestamp.value_or(0);
  return f;
}

std::string record_json(int rank, const std::string& timestamp) {
  return R"({"message": {"message": "ValueError: rank )" + std::to_string(rank) +
         R"(", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"w.py\", line 3, in )"
         R"(explode\nValueError: rank )" +
         std::to_string(rank) + R"(\n", "timestamp": ")" + timestamp + R"("}}})";
}

}  // namespace

TEST_CASE("read_error_file reads torch's @record layout (1.13 and 2.6 write the same)") {
  TempDir dir;
  // As written by ErrorHandler.record_exception: json.dump of a dict, timestamp str(int(time.time())).
  auto path = dir.write(
      "error.json",
      R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": )"
      R"("Traceback (most recent call last):\n  File \"w.py\", line 9, in main\nValueError: boom\n", )"
      R"("timestamp": "1700000123"}}})");
  auto e = read_error_file(path);
  REQUIRE(e);
  CHECK(e->message == "ValueError: boom");
  // Indented as torch shows it: every newline followed by two spaces.
  CHECK(e->traceback ==
        "Traceback (most recent call last):\n    File \"w.py\", line 9, in main\n  ValueError: boom\n  ");
  REQUIRE(e->timestamp);
  CHECK(*e->timestamp == 1700000123.0);
}

TEST_CASE("read_error_file: other shapes torch's agent tolerates, and broken files") {
  TempDir dir;
  SECTION("a numeric timestamp and an errorCode (the agent's copy of a child's file); no py_callstack") {
    auto e = read_error_file(dir.write(
        "e.json",
        R"({"message": {"message": "m", "errorCode": 7, "extraInfo": {"timestamp": 1700000000.5}}})"));
    REQUIRE(e);
    CHECK(e->message == "m");
    CHECK(e->traceback == "m");  // torch: py_callstack, else the message
    CHECK(e->timestamp == 1700000000.5);
  }
  SECTION("neither py_callstack nor message: <N/A>") {
    auto e = read_error_file(dir.write("e.json", R"({"message": {"extraInfo": {"timestamp": "5"}}})"));
    REQUIRE(e);
    CHECK(e->traceback == "<N/A>");
  }
  SECTION("message as a plain string: shown as is, dated by the top-level timestamp or 0 (torch's default)") {
    auto e = read_error_file(dir.write("e.json", R"({"message": "plain\ntext"})"));
    REQUIRE(e);
    CHECK(e->message == "plain\ntext");
    CHECK(e->traceback == "plain\ntext");
    CHECK(e->timestamp == 0.0);
    CHECK(read_error_file(dir.write("f.json", R"({"message": "p", "timestamp": 17})"))->timestamp == 17.0);
  }
  SECTION("a timestamp that is not a number is ignored") {
    auto e = read_error_file(
        dir.write("e.json", R"({"message": {"message": "m", "extraInfo": {"timestamp": "x"}}})"));
    REQUIRE(e);
    CHECK_FALSE(e->timestamp);
  }
  SECTION("not JSON: the raw text is the message") {
    auto e = read_error_file(dir.write("e.json", "Segmentation fault (partial write"));
    REQUIRE(e);
    CHECK(e->message == "Segmentation fault (partial write");
    CHECK(e->traceback == e->message);
  }
  SECTION("missing file") {
    CHECK_FALSE(read_error_file(dir.path / "nope.json"));
  }
}

TEST_CASE("root_cause: the earliest whole second, ties to the failure observed first") {
  auto at = [](int rank, double time) { return exited(rank, rank, 100 + rank, 1, 0, time); };
  SECTION("an error file a second older wins over the failure observed first") {
    CHECK(root_cause({at(0, 101.0), at(1, 100.0)}) == 1);
  }
  SECTION("an exit seen at 100.7 is not later than an error file's whole second 100") {
    CHECK(root_cause({at(1, 100.7), at(0, 100.0)}) == 0);
  }
  SECTION("equal timestamps: the first observed, whatever the ranks") {
    CHECK(root_cause({at(3, 100.0), at(0, 100.0), at(1, 100.0)}) == 0);
  }
  SECTION("one failure") {
    CHECK(root_cause({at(5, 42.0)}) == 0);
  }
}

TEST_CASE("python_signal_name: Python's signal.Signals names on Linux, <N/A> where it has none") {
  CHECK(python_signal_name(11) == "SIGSEGV");
  CHECK(python_signal_name(6) == "SIGABRT");
  CHECK(python_signal_name(16) == "SIGSTKFLT");
  CHECK(python_signal_name(17) == "SIGCHLD");
  CHECK(python_signal_name(29) == "SIGIO");
  CHECK(python_signal_name(31) == "SIGSYS");
  CHECK(python_signal_name(34) == "SIGRTMIN");
  CHECK(python_signal_name(37) == "<N/A>");
  CHECK(python_signal_name(64) == "SIGRTMAX");
  CHECK(python_signal_name(0) == "<N/A>");
}

TEST_CASE("signal_name: glibc's sigabbrev_np names with SIG, the number where it has none") {
  CHECK(signal_name(9) == "SIGKILL");
  CHECK(signal_name(15) == "SIGTERM");
  CHECK(signal_name(0) == "0");
  CHECK(signal_name(40) == "40");
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 32)
  // The table stands in for sigabbrev_np (glibc 2.32) in the release, built for glibc 2.31: the same names.
  for (int sig = 0; sig <= 64; ++sig) {
    const char* abbrev = ::sigabbrev_np(sig);
    CAPTURE(sig);
    CHECK(signal_name(sig) == (abbrev ? "SIG" + std::string(abbrev) : std::to_string(sig)));
  }
#endif
}

TEST_CASE("format_failure_summary: torch 2.6's text for an exit code without an error file") {
  utc();
  CHECK(format_failure_summary({exited(1, 1, 4242, 7, 0, kT0 + 0.8)}, "train.py", kHost) ==
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Failures:\n"
        "  <NO_OTHER_FAILURES>\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2023-11-14_22:13:20\n"
        "  host      : node1.example.com\n"
        "  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : 7 (pid: 4242)\n"
        "  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "============================================================\n");
}

TEST_CASE("format_failure_summary: signals, and rules as wide as the widest line (at most 60)") {
  utc();
  CHECK(format_failure_summary({exited(3, 1, 99, 0, 11, kT0)}, "t.py", kHost) ==
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "====================================================\n"
        "t.py FAILED\n"
        "----------------------------------------------------\n"
        "Failures:\n"
        "  <NO_OTHER_FAILURES>\n"
        "----------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2023-11-14_22:13:20\n"
        "  host      : node1.example.com\n"
        "  rank      : 3 (local_rank: 1)\n"
        "  exitcode  : -11 (pid: 99)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 11 (SIGSEGV) received by PID 99\n"
        "====================================================\n");
  // A real-time signal: Python has no name for it.
  CHECK(format_failure_summary({exited(1, 1, 12345, 0, 37, kT0)}, "train.py", kHost) ==
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "=====================================================\n"
        "train.py FAILED\n"
        "-----------------------------------------------------\n"
        "Failures:\n"
        "  <NO_OTHER_FAILURES>\n"
        "-----------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2023-11-14_22:13:20\n"
        "  host      : node1.example.com\n"
        "  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -37 (pid: 12345)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 37 (<N/A>) received by PID 12345\n"
        "=====================================================\n");
}

TEST_CASE("format_failure_summary: two error files, numbered in local-rank order, the older one the root") {
  utc();
  TempDir dir;
  // Observed: rank 1 after rank 0, but its error file is a second older.
  std::vector<WorkerFailure> fs{recorded(dir, 0, 1000, record_json(0, "1700000001"), "/tmp/g/e0.json"),
                                recorded(dir, 1, 1001, record_json(1, "1700000000"), "/tmp/g/e1.json")};
  const std::string expected =
      "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
      "================================================\n"
      "train.py FAILED\n"
      "------------------------------------------------\n"
      "Failures:\n"
      "[0]:\n"
      "  time      : 2023-11-14_22:13:21\n"
      "  host      : node1.example.com\n"
      "  rank      : 0 (local_rank: 0)\n"
      "  exitcode  : 1 (pid: 1000)\n"
      "  error_file: /tmp/g/e0.json\n"
      "  traceback : Traceback (most recent call last):\n"
      "    File \"w.py\", line 3, in explode\n"
      "  ValueError: rank 0\n"
      "  \n"
      "------------------------------------------------\n"
      "Root Cause (first observed failure):\n"
      "[1]:\n"
      "  time      : 2023-11-14_22:13:20\n"
      "  host      : node1.example.com\n"
      "  rank      : 1 (local_rank: 1)\n"
      "  exitcode  : 1 (pid: 1001)\n"
      "  error_file: /tmp/g/e1.json\n"
      "  traceback : Traceback (most recent call last):\n"
      "    File \"w.py\", line 3, in explode\n"
      "  ValueError: rank 1\n"
      "  \n"
      "================================================\n";
  CHECK(format_failure_summary(fs, "train.py", kHost) == expected);
  // The order observed does not change the numbering (torch's dict is in local-rank order).
  CHECK(format_failure_summary({fs[1], fs[0]}, "train.py", kHost) == expected);
}

TEST_CASE("format_failure_summary: other error-file shapes as torch shows them") {
  utc();
  TempDir dir;
  SECTION("a plain-string message is shown unindented") {
    CHECK(format_failure_summary(
              {recorded(dir, 0, 1000, R"({"message": "plain\ntext", "timestamp": 1700000005})",
                        "/tmp/g/p.json")},
              "train.py", kHost) ==
          "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
          "=================================\n"
          "train.py FAILED\n"
          "---------------------------------\n"
          "Failures:\n"
          "  <NO_OTHER_FAILURES>\n"
          "---------------------------------\n"
          "Root Cause (first observed failure):\n"
          "[0]:\n"
          "  time      : 2023-11-14_22:13:25\n"
          "  host      : node1.example.com\n"
          "  rank      : 0 (local_rank: 0)\n"
          "  exitcode  : 1 (pid: 1000)\n"
          "  error_file: /tmp/g/p.json\n"
          "  traceback : plain\n"
          "text\n"
          "=================================\n");
  }
  SECTION("no py_callstack: the message; widths count characters, not UTF-8 bytes") {
    CHECK(format_failure_summary(
              {recorded(
                  dir, 0, 7,
                  R"({"message": {"message": "just a message", "extraInfo": {"timestamp": "1700000000"}}})",
                  "/tmp/g/n.json")},
              "m", kHost) ==
          "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
          "=================================\n"
          "m FAILED\n"
          "---------------------------------\n"
          "Failures:\n"
          "  <NO_OTHER_FAILURES>\n"
          "---------------------------------\n"
          "Root Cause (first observed failure):\n"
          "[0]:\n"
          "  time      : 2023-11-14_22:13:20\n"
          "  host      : node1.example.com\n"
          "  rank      : 0 (local_rank: 0)\n"
          "  exitcode  : 1 (pid: 7)\n"
          "  error_file: /tmp/g/n.json\n"
          "  traceback : just a message\n"
          "=================================\n");
    std::string e40;
    for (int i = 0; i < 40; ++i) e40 += "\u00e9";
    const std::string text = format_failure_summary(
        {recorded(dir, 0, 1000,
                  R"({"message": {"message": "\u00e9", "extraInfo": {"py_callstack": ")" + e40 +
                      R"(\n", "timestamp": "1700000000"}}})",
                  "/tmp/g/u.json")},
        "x.py", kHost);
    CHECK_THAT(text, Catch::Contains("\n" + std::string(54, '=') + "\nx.py FAILED\n"));
    CHECK_THAT(text, Catch::Contains("  traceback : " + e40 + "\n  \n" + std::string(54, '=') + "\n"));
  }
}

TEST_CASE("format_failure_summary: ddprun's details come after torch's block") {
  utc();
  SECTION("a note, the stacks and a stderr tail, numbered as in the block") {
    WorkerFailure hung = exited(2, 2, 500, 6, 0, kT0);
    hung.message = "no progress from any rank for 10 s (--hang_timeout)";
    hung.stacks = "rank 2: main (t.py:3)\nranks 0,1: wait (t.py:9)\n";
    WorkerFailure other = exited(0, 0, 498, 3, 0, kT0 + 1);
    other.traceback = "ERRLINE28\nERRLINE29\n";  // the tail of its stderr.log: no error file
    const std::string text = format_failure_summary({hung, other}, "t.py", kHost);
    const auto end_of_block = text.find("=\nddprun: more on these failures:\n");
    REQUIRE(end_of_block != std::string::npos);
    CHECK_THAT(
        text.substr(0, end_of_block),
        Catch::Contains("Root Cause (first observed failure):\n[1]:\n") &&
            Catch::Contains("  exitcode  : 6 (pid: 500)\n  error_file: <N/A>\n  traceback : To enable") &&
            !Catch::Contains("ERRLINE") && !Catch::Contains("no progress"));
    CHECK(text.substr(end_of_block + 2) ==
          "ddprun: more on these failures:\n"
          "[0]: rank 0 (local_rank: 0)\n"
          "  stderr    : (its last lines)\n"
          "    ERRLINE28\n"
          "    ERRLINE29\n"
          "[1]: rank 2 (local_rank: 2)\n"
          "  message   : no progress from any rank for 10 s (--hang_timeout)\n"
          "  stacks    :\n"
          "    rank 2: main (t.py:3)\n"
          "    ranks 0,1: wait (t.py:9)\n");
  }
  SECTION("the NCCL flight recorder's dump a rank left is named, before its stderr tail") {
    WorkerFailure f = exited(0, 0, 700, 0, 6, kT0);
    f.nccl_trace = "/logs/run/attempt_0/0/nccl_trace_rank_0";
    f.traceback = "Watchdog caught collective operation timeout\n";
    CHECK(format_failure_summary({f}, "t.py", kHost)
              .ends_with(
                  "=\nddprun: more on these failures:\n[0]: rank 0 (local_rank: 0)\n"
                  "  nccl trace: /logs/run/attempt_0/0/nccl_trace_rank_0 (torch's NCCL flight recorder)\n"
                  "  stderr    : (its last lines)\n"
                  "    Watchdog caught collective operation timeout\n"));
  }
  SECTION("an error file's message is in its traceback already; a note in front of it is not") {
    TempDir dir;
    WorkerFailure f = recorded(dir, 1, 1001, record_json(1, "1700000000"), "/tmp/g/e1.json");
    CHECK(format_failure_summary({f}, "train.py", kHost).find("ddprun:") == std::string::npos);
    f.message = "rank 1 missed its deadline (scope load); " + f.message;
    CHECK(format_failure_summary({f}, "train.py", kHost)
              .ends_with("=\nddprun: more on these failures:\n[0]: rank 1 (local_rank: 1)\n"
                         "  message   : rank 1 missed its deadline (scope load); ValueError: rank 1\n"));
  }
}

TEST_CASE("local_fqdn: Python's socket.getfqdn(), never empty") {
  const std::string fqdn = local_fqdn();
  CHECK_FALSE(fqdn.empty());
  CHECK(local_fqdn() == fqdn);
  // The comparison with Python's own answer: tests/integration/test_pytorch_errors.py.
}
