// Worker failures: reading torch's error files and writing the summary the agent prints.
//
// A worker decorated with torch's @record writes TORCHELASTIC_ERROR_FILE as
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "<unix s>"}}}
// (or "message" as a plain string); torch 1.13 and 2.6 write the same layout, the timestamp a string of whole
// seconds. The root cause is the failure with the earliest timestamp; a worker without an error file is dated
// by when the agent saw it exit, and its stderr tail stands in for the traceback. Pure except
// read_error_file/read_tail (file reads); never throws on a malformed file.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "agent/process_context.h"  // signal_name

namespace ddprun::agent {

struct ErrorFileContent {
  std::string message;
  std::string traceback;
  std::optional<double> timestamp;  // unix seconds
};

// nullopt when the file is missing; a malformed file yields its raw text as message.
std::optional<ErrorFileContent> read_error_file(const std::filesystem::path& path);
// Last `lines` lines of a file ("" when unreadable).
std::string read_tail(const std::filesystem::path& path, size_t lines);

struct WorkerFailure {
  double time = 0;  // unix seconds: error-file timestamp, else when the exit was seen
  std::string host;
  int rank = 0;
  int local_rank = 0;
  int exit_code = 0;  // 0 when killed by a signal
  int signal = 0;
  int pid = 0;
  std::string error_file;  // "" when none was written
  std::string message;
  std::string traceback;  // from the error file, or the stderr tail
  std::string stacks;     // where every rank was (agent/stack_dump.h), one group per line; "" = not captured
};

// Index of the root cause: the earliest time at one-second resolution (error files have no finer one, so a
// failure dated 100.7 by its exit is not later than an error file's "100"); ties go to the failure listed
// first, i.e. observed first. `failures` (in the order observed) must not be empty.
size_t root_cause(const std::vector<WorkerFailure>& failures);
// The multi-line summary printed on failure (torchrun's layout: root cause first, then the others).
std::string format_failure_summary(const std::vector<WorkerFailure>& failures, const std::string& script);
// "exitcode 3" / "signal 11 (SIGSEGV)".
std::string describe_exit(int exit_code, int signal);

}  // namespace ddprun::agent
