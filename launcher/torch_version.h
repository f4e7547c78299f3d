// The torch the workers import, asked of their interpreter (--python): what differs between torch versions
// in what a launcher passes its workers (ddprun-launch's --local-rank spelling, the name of torch's NCCL
// async-error-handling variable), as torchrun's own torch decides it for torchrun.
//
// probe_torch_version runs `<python> -c <probe>` (importlib.metadata: torch is not imported; about 0.1 s) and
// remembers the answer in <cache>/ddprun/torch-versions (launcher/interpreter_check.h's cache directory)
// under the interpreter's cache key (interpreter_cache_key: the interpreter file, its environment, the
// working directory) together with torch's metadata directory (its dist-info/egg-info): an answer counts only
// while that directory still exists, so installing another torch (pip, apt: a new directory) asks again. No
// torch is not remembered. Blocking: kTorchProbeDeadline at most. Never throws.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::launcher {

inline constexpr std::chrono::milliseconds kTorchProbeDeadline{5000};

struct TorchVersion {
  int major = 0;
  int minor = 0;
  std::string text;  // as its metadata says: "2.6.0+debian", "1.13.0a0+gitunknown"
};

// "2.6.0+debian" -> {2, 6}; nullopt unless it starts with "<major>.<minor>".
std::optional<TorchVersion> parse_torch_version(std::string_view text);

// The version of the torch that `python` (a path or a name in env's PATH) imports with `env` in `cwd`;
// nullopt when it has none, or it cannot be asked (no interpreter, a failure, the deadline).
std::optional<TorchVersion> probe_torch_version(const std::string& python,
                                                const std::map<std::string, std::string>& env,
                                                const std::string& cwd, bool use_cache = true);

// The variable torch reads for NCCL's async error handling, which torchrun sets to 1 when unset:
// NCCL_ASYNC_ERROR_HANDLING before torch 2.2, TORCH_NCCL_ASYNC_ERROR_HANDLING since (torch 2.2 renamed it
// and warns about the old name in every rank); the new name when the version is unknown.
std::string nccl_async_error_handling_var(const std::optional<TorchVersion>& torch);

// ddprun-launch's "auto" spelling of the script's local-rank argument: "--local_rank" for torch 1.x,
// "--local-rank" for torch >= 2.0 or an unknown one.
std::string local_rank_arg(const std::optional<TorchVersion>& torch);

}  // namespace ddprun::launcher
