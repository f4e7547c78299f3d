#include "state_agreement.h"

#include <algorithm>

namespace ddprun::sdk::state {
namespace {

constexpr const char* kNoCommonStep = "no step that every rank committed";

std::string has_key(const std::string& base, const StepAttempt& v) {
  return base + "has/" + std::to_string(v.step) + "." + std::to_string(v.attempt);
}

}  // namespace

Agreement agree(rdzv::Store& store, int call, const std::vector<StepAttempt>& mine, int world_size,
                const std::string& why, std::chrono::milliseconds timeout) {
  const std::string base = "ddprun.state/load" + std::to_string(call) + "/";
  for (const StepAttempt& v : mine) store.add(has_key(base, v), 1);
  if (!why.empty()) {
    store.set(base + "why", why);
    store.add(base + "whys", 1);
  }
  if (store.add(base + "arrived", 1) == world_size) store.set(base + "all", "1");
  store.wait({base + "all"}, timeout);
  std::vector<StepAttempt> newest_first = mine;
  std::sort(newest_first.rbegin(), newest_first.rend());
  for (const StepAttempt& v : newest_first) {
    if (store.add(has_key(base, v), 0) == world_size) return {v, ""};
  }
  if (store.add(base + "whys", 0) > 0) return {std::nullopt, store.get(base + "why")};
  return {std::nullopt, kNoCommonStep};
}

Agreement agree_alone(const std::vector<StepAttempt>& mine, const std::string& why) {
  if (!mine.empty()) return {*std::max_element(mine.begin(), mine.end()), ""};
  return {std::nullopt, why.empty() ? kNoCommonStep : why};
}

}  // namespace ddprun::sdk::state
