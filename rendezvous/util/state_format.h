// state_format: the files of ddprun's in-memory training state (docs/state.md, "The version file"). One file
// holds one committed version of one rank's state; the worker's library writes it (Python ddprun.state,
// agent/state/python/ddprun/state.py; C++ ddprun::sdk::state, worker_sdk/src/state.cc) into the agent's
// directory, and the agents copy it to a buddy node (agent/state/). Here, below both the agent and the SDK,
// because both read it.
//
// A version file is named rank<R>.step<S>.ddps and holds, in order:
//   payload    tensor bytes, each at a kAlign-aligned offset, then (Python) the pickled rest of the state
//   manifest   text: the line "ddprun-state 1", then one "<key> <value>" line each (below)
//   length     the manifest's length in bytes, u64 little-endian
//   magic      the 8 bytes kMagic
// Manifest keys: step S, attempt A (TORCHELASTIC_RESTART_COUNT of the writer), rank R, world_size W, payload
// N (bytes before the manifest), writer python|c++, and repeated:
//   tensor OFFSET NBYTES DTYPE SHAPE DEVICE [NAME]    SHAPE "2x3" ("-": a scalar); NAME to the end of the
//   line pickle OFFSET NBYTES                              the Python writer's pickle (tensors by index)
// Unknown keys are skipped (a later writer may add some). A writer first creates .rank<R>.step<S>.<tag>.tmp
// in the same directory and renames it to its name when complete: the rename is the commit, so a writer
// killed mid-save leaves only a temporary file, which is never read.
//
// Pure functions except read_manifest (pread on a file) and the directory's listing and pruning (below),
// which the agent (agent/state/state_directory.h) and the SDK's writer (worker_sdk/src/state.cc) share.
// Thread-safe. Nothing throws except std::bad_alloc; what a file holds is read tolerantly (nullopt, with the
// reason in `why`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

inline constexpr std::string_view kStateMagic = "DDPRST1\n";
inline constexpr uint64_t kStateAlign = 64;
// The manifest may not be longer (a tensor line each: 100k tensors fit).
inline constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;

// Which rank and step a version file's name says.
struct VersionName {
  int rank = 0;
  int64_t step = 0;
  bool operator==(const VersionName&) const = default;
};

std::string version_file_name(const VersionName& v);
// rank<R>.step<S>.ddps with R, S plain non-negative decimals; nullopt for anything else (temporary files
// included).
std::optional<VersionName> parse_version_file_name(std::string_view name);
// A writer's unfinished file: ".rank<R>.step<S>.<tag>.tmp" (any name starting with "." and ending in ".tmp").
bool is_temporary_state_file(std::string_view name);

// A committed version in a directory, as listed.
struct StoredVersion {
  VersionName name;
  std::filesystem::path file;
  uint64_t bytes = 0;
};
// The committed versions in `dir` (of `rank` only, unless -1), by rank, then step (oldest first). A file
// removed while it is listed is left out; a directory that cannot be read lists nothing.
std::vector<StoredVersion> list_versions(const std::filesystem::path& dir, int rank = -1);
// Removes the committed versions of `rank` in `dir` but the `keep` newest (those already gone are no error).
void prune_versions(const std::filesystem::path& dir, int rank, size_t keep);

struct TensorEntry {
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  std::string dtype;           // torch's name without "torch.": float32, bfloat16, int64, ...
  std::vector<int64_t> shape;  // empty: a scalar
  std::string device = "cpu";  // where it was saved from ("cuda:0")
  std::string name;            // "" when the writer gives none (Python: the pickle refers to the index)
};

struct Manifest {
  int64_t step = 0;
  int attempt = 0;
  int rank = 0;
  int world_size = 0;
  uint64_t payload = 0;
  std::string writer;
  std::vector<TensorEntry> tensors;
  std::optional<std::pair<uint64_t, uint64_t>> pickle;  // offset, bytes
};

// The manifest's text (written between the payload and the length).
std::string manifest_text(const Manifest& m);
// Reads a manifest's text; nullopt with the reason when it is not one (bad first line, a known key with an
// unreadable value, a tensor or the pickle outside the payload, a missing step/rank/world_size/payload).
std::optional<Manifest> parse_manifest(std::string_view text, std::string& why);
// What follows the payload: the manifest's text, its length, the magic.
std::string manifest_trailer(const Manifest& m);
// The manifest of the version file open at `fd`, `size` bytes long, checked against its size (payload +
// manifest + 16 == size). nullopt with the reason (naming neither file nor fd: the caller does).
std::optional<Manifest> read_manifest(int fd, uint64_t size, std::string& why);

// Bytes of one element of torch dtype `dtype` (as in TensorEntry::dtype); nullopt for an unknown name.
std::optional<uint64_t> dtype_bytes(std::string_view dtype);
// "2x3" (empty shape: "-"), and back (nullopt when unreadable).
std::string shape_text(const std::vector<int64_t>& shape);
std::optional<std::vector<int64_t>> parse_shape(std::string_view text);

// `n` rounded up to kStateAlign.
inline uint64_t state_aligned(uint64_t n) {
  return (n + kStateAlign - 1) / kStateAlign * kStateAlign;
}

}  // namespace ddprun
