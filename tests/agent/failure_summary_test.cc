// Unit tests of agent/failure_summary: reading torch's @record error files, choosing the root cause, the
// summary's layout. The error files are written to a fresh temporary directory.
#include "agent/failure_summary.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "catch_compat.h"

namespace fs = std::filesystem;
using namespace ddprun::agent;

namespace {

// A temporary directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddprun-failure-summary-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
};

WorkerFailure failure(int rank, double time, std::string error_file = "") {
  return WorkerFailure{.time = time,
                       .host = "node1",
                       .rank = rank,
                       .local_rank = rank,
                       .exit_code = 1,
                       .pid = 1000 + rank,
                       .error_file = std::move(error_file),
                       .message = "ValueError: rank " + std::to_string(rank),
                       .traceback =
                           "Traceback (most recent call last):\n  File \"w.py\", line 3, in explode\n"
                           "ValueError: rank " +
                           std::to_string(rank) + "\n"};
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
  CHECK(e->traceback ==
        "Traceback (most recent call last):\n  File \"w.py\", line 9, in main\nValueError: boom\n");
  REQUIRE(e->timestamp);
  CHECK(*e->timestamp == 1700000123.0);
}

TEST_CASE("read_error_file: other shapes torch's agent tolerates, and broken files") {
  TempDir dir;
  SECTION("a numeric timestamp and an errorCode (the agent's copy of a child's file)") {
    auto e = read_error_file(dir.write(
        "e.json",
        R"({"message": {"message": "m", "errorCode": 7, "extraInfo": {"timestamp": 1700000000.5}}})"));
    REQUIRE(e);
    CHECK(e->message == "m");
    CHECK(e->traceback.empty());
    CHECK(e->timestamp == 1700000000.5);
  }
  SECTION("message as a plain string") {
    auto e = read_error_file(dir.write("e.json", R"({"message": "plain text"})"));
    REQUIRE(e);
    CHECK(e->message == "plain text");
    CHECK_FALSE(e->timestamp);
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
  }
  SECTION("missing file") {
    CHECK_FALSE(read_error_file(dir.path / "nope.json"));
  }
}

TEST_CASE("root_cause: the earliest whole second, ties to the failure observed first") {
  SECTION("an error file a second older wins over the failure observed first") {
    CHECK(root_cause({failure(0, 101.0), failure(1, 100.0)}) == 1);
  }
  SECTION("an exit seen at 100.7 is not later than an error file's whole second 100") {
    CHECK(root_cause({failure(1, 100.7), failure(0, 100.0)}) == 0);
  }
  SECTION("equal timestamps: the first observed, whatever the ranks") {
    CHECK(root_cause({failure(3, 100.0), failure(0, 100.0), failure(1, 100.0)}) == 0);
  }
  SECTION("one failure") {
    CHECK(root_cause({failure(5, 42.0)}) == 0);
  }
}

TEST_CASE("format_failure_summary: the others first, then the root cause with its error file and traceback") {
  std::vector<WorkerFailure> fs{failure(0, 101.0, "/logs/run/attempt_0/0/error.json"),
                                failure(1, 100.0, "/logs/run/attempt_0/1/error.json")};
  std::string text = format_failure_summary(fs, "train.py");
  auto root_at = text.find("Root Cause (first observed failure):\n[0]:\n");
  REQUIRE(root_at != std::string::npos);
  std::string others = text.substr(0, root_at);
  std::string root = text.substr(root_at);
  CHECK_THAT(text, Catch::StartsWith(std::string(72, '=') + "\ntrain.py FAILED\n"));
  CHECK_THAT(others, Catch::Contains("[1]:\n"));
  CHECK_THAT(others, Catch::Contains("  rank      : 0 (local_rank: 0)\n"));
  CHECK_THAT(others, Catch::Contains("  error_file: /logs/run/attempt_0/0/error.json\n"));
  CHECK_THAT(root, Catch::Contains("  rank      : 1 (local_rank: 1)\n"));
  CHECK_THAT(root, Catch::Contains("  exitcode  : 1 (exitcode 1)\n"));
  CHECK_THAT(root, Catch::Contains("  error_file: /logs/run/attempt_0/1/error.json\n"));
  CHECK_THAT(root, Catch::Contains("  message   : ValueError: rank 1\n"));
  CHECK_THAT(root, Catch::Contains("  traceback : \n    Traceback (most recent call last):\n"
                                   "      File \"w.py\", line 3, in explode\n    ValueError: rank 1\n"));

  std::string alone = format_failure_summary({failure(2, 5.0)}, "train.py");
  CHECK_THAT(alone, Catch::Contains("Failures:\n  <NO_OTHER_FAILURES>\n"));
  CHECK_THAT(alone, Catch::Contains("  error_file: <N/A>\n"));
}
