// ddprun::sdk::state: the newest training state in the agents' memory, agreed by every rank — the C++
// counterpart of Python's ddprun.state (docs/state.md, "The C++ API"), with the same guarantees.
//
//   auto ctx = ddprun::sdk::init();
//   int64_t start = 0;
//   if (auto v = ddprun::sdk::state::load(*ctx)) {        // every rank calls it; nullopt on a first start
//     const auto* w = v->find("weight");                  // read-only bytes of the version, no copy
//     std::memcpy(weight.data(), w->data, w->nbytes);
//     start = v->step() + 1;
//   }
//   for (int64_t step = start; step < steps; ++step) {
//     ...
//     if (step % 100 == 0)
//       ddprun::sdk::state::save(step, {{"weight", "float32", {n}, "cpu", weight.data(), 4 * n}}, true);
//   }
//   ddprun::sdk::state::wait();                           // the last async save committed
//
// save(step, buffers, async): writes the named buffers (host memory) as this rank's version of `step` into
// $DDPRUN_STATE_DIR: .rank<R>.step<S>.<pid>.tmp, renamed to rank<R>.step<S>.ddps when complete (the rename is
// the commit: a worker killed mid-save leaves nothing that loads). The manifest says `writer c++` and each
// tensor's name (rendezvous/util/state_format.h). Versions kept: the two newest committed (and the one being
// written). With async, the buffers are copied into a staging buffer of this process (reused, one more copy
// of the state in memory) and a thread writes and commits; the next save(), load() or wait() waits for it and
// rethrows what it threw. Returns true; false outside a job started with --state_memory (one warning on
// stderr). Throws StateMemoryError when the version does not fit this rank's share ($DDPRUN_STATE_QUOTA): the
// message gives the --state_memory to start with; StateError when the file cannot be written;
// std::invalid_argument for a buffer that does not describe itself (unknown dtype, nbytes not shape x
// element size, an empty, duplicate or multi-line name, a null pointer), before anything is written.
//
// load(ctx, timeout): the newest (step, attempt) that every rank of the job committed, agreed through
// ctx.store() (the SDK's store, namespaced per attempt; alone, without a store, this rank's newest), or
// nullopt: why_none() says why (a first start: "rank 3 has no version on this node"; a job of another world
// size: no resharding). Every rank must call it, the same number of times; it blocks until every rank has
// arrived or `timeout` passes (StateError). Versions newer than the agreed step are deleted. The Version
// maps the file privately: its views are read-only and valid while any copy of the Version lives. A version
// of the Python writer comes back with its tensors unnamed (its pickle, which names them, is not read).
//
// Environment (set by ddprun): DDPRUN_STATE_DIR, DDPRUN_STATE_QUOTA, RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// TORCHELASTIC_RESTART_COUNT (the attempt, which a version records). Call these from one thread (the
// training loop); the background write is the only other thread. libtorch tensors: ddprun/torch_state.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/context.h"

namespace ddprun::sdk::state {

class StateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A version that does not fit this rank's share of --state_memory.
class StateMemoryError : public StateError {
 public:
  using StateError::StateError;
};

// One named tensor to save: `nbytes` bytes of host memory at `data`, contiguous, of torch dtype `dtype`
// ("float32", "bfloat16", "int64", ...: torch's name without "torch.") and shape `shape` (empty: a scalar);
// `device` is where the tensor lives in the program ("cuda:0"), recorded for load. Read during save() only
// (an async save copies it before returning).
struct Buffer {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string device = "cpu";
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// One tensor of a loaded version: as saved, `data` inside the Version's mapping.
struct TensorView {
  std::string name;  // "" in a version of the Python writer
  std::string dtype;
  std::vector<int64_t> shape;
  std::string device;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// A loaded version. Copies share the mapping; it is unmapped when the last copy (or keepalive()) goes.
class Version {
 public:
  int64_t step() const { return step_; }
  int attempt() const { return attempt_; }
  const std::string& writer() const { return writer_; }  // "c++" or "python"
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // The tensor named `name`, or nullptr.
  const TensorView* find(std::string_view name) const;
  // Owns the mapping: hold it to keep the views' memory valid beyond the Version (torch_state.h does).
  std::shared_ptr<const void> keepalive() const { return mapping_; }

 private:
  friend struct VersionAccess;
  int64_t step_ = 0;
  int attempt_ = 0;
  std::string writer_;
  std::vector<TensorView> tensors_;
  std::shared_ptr<const void> mapping_;
};

// True when ddprun started this worker with --state_memory ($DDPRUN_STATE_DIR set).
bool enabled();

// See above. `step` >= 0 (std::invalid_argument otherwise).
bool save(int64_t step, std::span<const Buffer> buffers, bool async = false);
inline bool save(int64_t step, const std::vector<Buffer>& buffers, bool async = false) {
  return save(step, std::span<const Buffer>(buffers), async);
}

// Waits until the async save in progress (if any) is committed; throws StateError with what it threw.
void wait();

// See above.
std::optional<Version> load(Context& ctx, std::chrono::milliseconds timeout = std::chrono::minutes(5));

// Why the last load() returned nullopt ("" when it did not).
std::string why_none();

}  // namespace ddprun::sdk::state
