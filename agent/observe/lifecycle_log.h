// LifecycleLog: the agent's lifecycle events as JSON lines for log shippers (--event_log_handler file:PATH;
// docs/observability.md#the-event-log). Every event is one line appended to PATH with a single write(2)
// (O_APPEND: agents of several nodes may share a file on one host), with the fields
//   {"v": 1, "time" (unix seconds), "event", "run_id", "host", "agent_pid", "round" (null: none yet), ...}
// and the event's own:
//   round_formed      node_rank, nodes, world_size, ranks [first, last], rendezvous_s, dropped_nodes
//   node_lost         node (identity of a member of the previous round that is not in this one)
//   node_unhealthy    reason, attempt, attempts (this node stands aside; it is excluded from the next round)
//   worker_exit       rank, local_rank, pid, exit_code or signal (the other null)
//   round_end         reason (failure, membership, signal, done, exit), by_node (who ended it), detail
//   restart           restarts_used, restarts_max, reason (the round's end that caused it)
//   hang              seconds (no local rank made progress for that long)
//   straggler         rank, rank_host, before_collective_s, median_s, factor (node rank 0 only)
//   straggler_end     rank, rank_host, before_collective_s, median_s
//   agent_exit        exit_code, state (done, failed), detail
// A file that cannot be opened is an error at start (the agent exits 2, naming it, before any worker starts):
// a FIFO with no reader too, at once (the file is opened non-blocking). An event that cannot be written later
// (a full disk, a pipe whose reader is gone or too slow) is dropped, said at most once a minute with the
// count, and the log stays on: the job never waits for it.
//
// Threads: the agent loop's. Nothing throws but std::bad_alloc and, from open(), std::system_error.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ddprun::agent {

// An event's own fields, written in the order given.
using EventFields = nlohmann::ordered_json;

class LifecycleLog {
 public:
  // Off until open(): record() does nothing.
  LifecycleLog() = default;
  ~LifecycleLog();
  LifecycleLog(const LifecycleLog&) = delete;
  LifecycleLog& operator=(const LifecycleLog&) = delete;

  // Opens (creates) `file` for appending; std::system_error naming it when it cannot.
  void open(const std::filesystem::path& file, std::string run_id, std::string host);
  bool on() const { return fd_ >= 0; }
  // The round the next events name (-1: none).
  void set_round(int round) { round_ = round; }
  // Appends {common fields..., "event": event, fields...}.
  void record(const std::string& event, const EventFields& fields = EventFields::object());
  // Events dropped so far (tests).
  uint64_t dropped_events() const { return dropped_; }

 private:
  static constexpr std::chrono::milliseconds kLineFinish{1000};
  int write_line(const std::string& text);
  void drop(int error);

  int fd_ = -1;
  bool fifo_ = false;  // a pipe: a line is written whole or not at all
  uint64_t dropped_ = 0;
  std::optional<std::chrono::steady_clock::time_point> last_complaint_;
  std::filesystem::path file_;
  std::string run_id_, host_;
  int round_ = -1;
};

}  // namespace ddprun::agent
