// The process table as /proc shows it, and the sweep that ends every descendant of a process.
//
// parse_proc_stat and descendants are pure (text in, values out). read_process_table reads /proc; processes
// that vanish while it reads are left out. kill_descendants is the agent's end-of-run sweep when no cgroup
// holds the workers (agent/process/orphan_guard.h): with the agent a child subreaper, an orphan of the
// workers is re-parented to the agent, so every process the workers started is in the agent's ppid tree.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string_view>
#include <vector>

namespace ddprun::agent {

struct ProcStat {
  pid_t pid = 0;
  char state = '?';  // R, S, D, Z, T, ...
  pid_t ppid = 0;
  pid_t pgrp = 0;
  pid_t session = 0;

  bool operator==(const ProcStat&) const = default;
};

// The text of /proc/<pid>/stat; nullopt when it is malformed. The command name (in parentheses) may contain
// spaces and parentheses: the fields after it start at the last ')'.
std::optional<ProcStat> parse_proc_stat(std::string_view text);

// Every process of `table` whose ppid chain reaches `root` (root itself excluded), except `skip` and its own
// descendants. Ascending. A ppid cycle (impossible in a consistent table) ends the walk.
std::vector<pid_t> descendants(const std::vector<ProcStat>& table, pid_t root, pid_t skip = -1);

// Every process in /proc (one read of each /proc/<pid>/stat; not an atomic snapshot).
std::vector<ProcStat> read_process_table();

// SIGKILLs every descendant of this process except `skip` (and its descendants), and reaps this process's
// children among them, until none is left or `deadline` passes (then false). Each victim is signalled
// through a pidfd (no pid-reuse race) and awaited on it. Children that are not among the victims are never
// reaped. Blocks; any thread.
bool kill_descendants(pid_t skip, std::chrono::steady_clock::time_point deadline);

}  // namespace ddprun::agent
