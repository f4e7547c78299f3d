// StateDirectory: the agent's memory-backed directory of one job's training state (docs/state.md):
//   <dir>/own/      the versions of this node's ranks: the workers write and commit them there
//                   (DDPRUN_STATE_DIR), the agent restores the ones a node lost into it
//                   (agent/state/state_keeper.h)
//   <dir>/replica/  the versions of the buddy node's ranks, as its agent sent them
//   (agent/state/replica_server.h)
// Files are rendezvous/util/state_format.h's: committed versions rank<R>.step<S>.ddps, and temporary ones
// (".<...>.tmp") that a writer has not committed (yet, or ever: killed mid-save).
//
// Threads: the queries and remove_temporaries() may run on any thread (they read the directory as it is
// then); remove() on the owner's. Errors: the constructor throws std::filesystem::filesystem_error naming the
// path; the rest never throw but std::bad_alloc (a file that vanishes meanwhile is skipped).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/util/state_format.h"

namespace ddprun::agent {

// <dir>/own: where the workers write (their DDPRUN_STATE_DIR).
inline std::filesystem::path state_own_dir(const std::filesystem::path& dir) {
  return dir / "own";
}

class StateDirectory {
 public:
  // Creates `dir` with own/ and replica/, mode 0700, fresh: what a dead agent that had this name (its pid)
  // left there is removed first.
  explicit StateDirectory(std::filesystem::path dir);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path own() const { return state_own_dir(dir_); }
  std::filesystem::path replica() const { return dir_ / "replica"; }

  // The committed versions in `sub` (own() or replica()), by rank, then step (oldest first).
  static std::vector<StoredVersion> versions(const std::filesystem::path& sub) { return list_versions(sub); }
  // The newest committed version of `rank` in `sub`.
  static std::optional<StoredVersion> newest(const std::filesystem::path& sub, int rank);
  // Removes the temporary files in `sub` (call it while no writer runs there); returns their names.
  static std::vector<std::string> remove_temporaries(const std::filesystem::path& sub);
  // Removes the committed versions of `rank` in `sub` but the `keep` newest.
  static void prune(const std::filesystem::path& sub, int rank, size_t keep) {
    prune_versions(sub, rank, keep);
  }
  // Bytes of every file in the directory.
  uint64_t bytes_held() const;
  // Removes the directory and everything in it; errors are ignored. Idempotent.
  void remove();

 private:
  std::filesystem::path dir_;
};

}  // namespace ddprun::agent
