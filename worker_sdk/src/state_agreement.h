// state_agreement: how the ranks of a job agree on the version they all load (ddprun::sdk::state::load,
// docs/state.md). The same algorithm and store keys as Python's ddprun.state._agree, so either writer's
// versions are agreed on alike:
//   every rank adds 1 to  ddprun.state/load<N>/has/<step>.<attempt>  for each version it can load,
//   sets ddprun.state/load<N>/why (and adds 1 to .../whys) when it has a reason some cannot,
//   adds 1 to .../arrived; the world_size-th arrival sets .../all; every rank waits for .../all,
//   then takes the newest of its own versions whose counter equals world_size (every rank has it).
// N counts this process's load() calls from 1: every rank must call load() the same number of times. The
// store must be one the attempt's ranks share and no earlier attempt wrote (the SDK's is namespaced per
// attempt).
//
// Blocking: up to `timeout` waiting for every rank; store failures (rdzv::StoreError, a TimeoutError when a
// rank does not arrive in time) propagate. Thread-compatible (one call at a time per store).
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/rdzv/store.h"

namespace ddprun::sdk::state {

// What a version is agreed by: the step and the attempt that wrote it (a step written again in a later
// attempt is another version).
struct StepAttempt {
  int64_t step = 0;
  int attempt = 0;
  auto operator<=>(const StepAttempt&) const = default;
};

struct Agreement {
  std::optional<StepAttempt> agreed;  // nullopt: no version every rank has
  std::string why;                    // then: a rank's reason, or "no step that every rank committed"
};

// `mine`: this rank's loadable versions; `why`: its reason for one it cannot load ("" when none); `call`: N.
Agreement agree(rdzv::Store& store, int call, const std::vector<StepAttempt>& mine, int world_size,
                const std::string& why, std::chrono::milliseconds timeout);

// The newest of `mine` alone (a single process: nobody to agree with), with the same reasons as agree().
Agreement agree_alone(const std::vector<StepAttempt>& mine, const std::string& why);

}  // namespace ddprun::sdk::state
