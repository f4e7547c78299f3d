#include "launcher/torch_version.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <system_error>

#include "agent/process/worker_launch.h"  // find_program
#include "launcher/interpreter_check.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {

namespace {

constexpr const char* kCacheName = "torch-versions";
constexpr const char* kMarker = "ddprun-torch: ";

// Writes "ddprun-torch: <version> <metadata dir>" to stderr, or nothing without torch. Imports no torch.
constexpr const char* kProbe =
    "import importlib.metadata as m, sys\n"
    "try:\n"
    "    d = m.distribution('torch')\n"
    "except Exception:\n"
    "    sys.exit(0)\n"
    "sys.stderr.write('ddprun-torch: %s %s\\n' % (d.version, getattr(d, '_path', '')))\n";

bool exists(const std::string& path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0;
}

// "<key> <version> <metadata dir>" lines: the newest one for `key` whose directory still exists.
std::optional<TorchVersion> from_cache(const std::string& file, const std::string& key) {
  std::optional<TorchVersion> found;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string k, version, dir;
    if (!(fields >> k >> version) || k != key) continue;
    std::getline(fields >> std::ws, dir);
    if (exists(dir)) found = parse_torch_version(version);
  }
  return found;
}

}  // namespace

std::optional<TorchVersion> parse_torch_version(std::string_view text) {
  const auto parts = split(text.substr(0, text.find_first_of("+ ")), '.');
  if (parts.size() < 2) return std::nullopt;
  auto major = parse_int(parts[0]);
  std::string minor_digits = parts[1].substr(0, parts[1].find_first_not_of("0123456789"));
  auto minor = parse_int(minor_digits);
  if (!major || !minor || *major < 0 || *minor < 0) return std::nullopt;
  return TorchVersion{static_cast<int>(*major), static_cast<int>(*minor), std::string(text)};
}

std::optional<TorchVersion> probe_torch_version(const std::string& python,
                                                const std::map<std::string, std::string>& env,
                                                const std::string& cwd, bool use_cache) {
  InterpreterCheck check{.env = env, .cwd = cwd, .deadline = kTorchProbeDeadline};
  try {
    check.exe = agent::find_program(python, env, "--python");
  } catch (const std::system_error&) {
    return std::nullopt;  // the preflight names a missing interpreter
  }
  const std::string file = use_cache ? cache_file(env, kCacheName) : "";
  const std::string key = file.empty() ? "" : interpreter_cache_key(check);
  if (!key.empty()) {
    if (auto cached = from_cache(file, key)) return cached;
  }
  std::string err;
  const int status = run_interpreter(check, {"-c", kProbe}, err);
  if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  const size_t at = err.rfind(kMarker);
  if (at == std::string::npos) return std::nullopt;
  std::string line = err.substr(at + std::string(kMarker).size());
  line = line.substr(0, line.find('\n'));
  const std::string version = line.substr(0, line.find(' '));
  const std::string dir = line.find(' ') == std::string::npos ? "" : line.substr(line.find(' ') + 1);
  auto torch = parse_torch_version(version);
  if (torch && !key.empty() && exists(dir)) remember(file, key + " " + version + " " + dir);
  return torch;
}

std::string nccl_async_error_handling_var(const std::optional<TorchVersion>& torch) {
  const bool before_2_2 = torch && (torch->major < 2 || (torch->major == 2 && torch->minor < 2));
  return before_2_2 ? "NCCL_ASYNC_ERROR_HANDLING" : "TORCH_NCCL_ASYNC_ERROR_HANDLING";
}

std::string local_rank_arg(const std::optional<TorchVersion>& torch) {
  return torch && torch->major < 2 ? "--local_rank" : "--local-rank";
}

}  // namespace ddprun::launcher
