// Worker failures: reading torch's error files and writing the summary the agent prints.
//
// A worker decorated with torch's @record writes TORCHELASTIC_ERROR_FILE as
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "<unix s>"}}}
// (or "message" as a plain string); torch 1.13 and 2.6 write the same layout, the timestamp a string of whole
// seconds. The root cause is the failure with the earliest timestamp; a worker without an error file is dated
// by when the agent saw it exit.
//
// The summary is torchrun 2.x's text byte for byte (torch/distributed/elastic/multiprocessing/errors/
// __init__.py: ChildFailedError.format_msg and ProcessFailure, as its traceback prints it; 1.13 prints the
// same): the exception line "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", rules of
// min(60, widest line) '=' and '-', the other failures then the root cause, each as
//   [<idx>]:
//     time      : <local time YYYY-MM-DD_HH:MM:SS>
//     host      : <socket.getfqdn()>
//     rank      : <rank> (local_rank: <local rank>)
//     exitcode  : <exit code, or -signal> (pid: <pid>)
//     error_file: <path, or <N/A>>
//     traceback : <the error file's py_callstack, continuation lines indented by two spaces; without an
//                 error file "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
//                 or "Signal 11 (SIGSEGV) received by PID <pid>" for a signal>
// numbered in local-rank order (torch's dict order). What ddprun knows beyond torch (a note such as a hang,
// where every rank was, the last lines of a stderr.log) follows the block, never inside it.
//
// Pure except read_error_file/read_tail (file reads) and local_fqdn (a resolver look-up); never throws on a
// malformed file.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker_failure.h"

namespace ddprun::agent {

struct ErrorFileContent {
  std::string message;  // message.message, or "message" itself when it is a string; the raw text if no JSON
  // What torch prints after "traceback : ": py_callstack (else message.message, else "<N/A>") with every '\n'
  // followed by two spaces, as torch indents it; a plain-string message as it is.
  std::string traceback;
  // unix seconds: extraInfo.timestamp; for a plain-string message the top-level "timestamp", 0 when absent
  // (as torch reads it). nullopt when torch could not read one (it would fail on such a file).
  std::optional<double> timestamp;
};

// nullopt when the file is missing; a malformed file yields its raw text as message and traceback.
std::optional<ErrorFileContent> read_error_file(const std::filesystem::path& path);
// Last `lines` lines of a file ("" when unreadable).
std::string read_tail(const std::filesystem::path& path, size_t lines);

// Index of the root cause: the earliest time at one-second resolution (error files have no finer one, so a
// failure dated 100.7 by its exit is not later than an error file's "100"); ties go to the failure listed
// first, i.e. observed first (torch, which sees exits only every monitor interval, takes the lowest local
// rank among the failures of one poll). `failures` (in the order observed) must not be empty.
size_t root_cause(const std::vector<WorkerFailure>& failures);

// The text printed on failure (see the top of this file): torch's block, then ddprun's details, if any.
// `script` is torch's entrypoint name (the training script, the module with -m, the program with
// --no_python); `host` what the host lines show. `failures` must not be empty.
std::string format_failure_summary(const std::vector<WorkerFailure>& failures, const std::string& script,
                                   const std::string& host);
// The same with host = local_fqdn().
std::string format_failure_summary(const std::vector<WorkerFailure>& failures, const std::string& script);

// torch's @record on torchrun's main (ErrorHandler.dump_error_file): when the launcher itself runs with
// TORCHELASTIC_ERROR_FILE set (under TorchX, or another launcher), the root cause's error file is copied
// there when the job fails, as json.dumps writes it, with "errorCode" (the worker's exit code, -N for signal
// N) added to its "message" object when it has none. `parent`'s old content is replaced. A root cause without
// an error file leaves `parent` alone (torch only logs it). An error file that is not JSON is copied as it
// is. Returns
// "" or, when `parent` cannot be written, why (torch logs a warning and goes on).
std::string copy_root_cause_error_file(const WorkerFailure& root_cause, const std::filesystem::path& parent);

// What torch's @record writes for an exception that ended torchrun itself: {"message": {"message": <message>,
// "extraInfo": {"py_callstack": <message>, "timestamp": "<unix s>"}}} (ddprun has no Python stack: the
// message stands in for it). For a signal, torch's message is "SignalException: Process <pid> got signal:
// <n>". Returns "" or why `parent` cannot be written.
std::string write_launcher_error_file(const std::string& message, const std::filesystem::path& parent);

// Python's socket.getfqdn() for this machine: gethostname(), its first address (getaddrinfo), the reverse
// look-up of that address, and of its name and aliases the first that contains a '.', else its name; the
// host name itself when a look-up fails. Looked up once (it may wait for the resolver), then cached.
// Thread-safe.
std::string local_fqdn();

// Python's signal.Signals(sig).name on Linux ("SIGSEGV", "SIGRTMIN" for 34); "<N/A>" for a number Python
// has no name for (35..63), as torch 2.x prints it.
std::string python_signal_name(int sig);

}  // namespace ddprun::agent
