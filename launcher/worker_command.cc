// The command line of each worker (LaunchConfig::worker_argv): torchrun's modes, ${local_rank} in the
// arguments, and ddprun-launch's --local-rank=N. Declared in launcher/launch_config.h.
#include <cctype>
#include <string>
#include <vector>

#include "launcher/launch_config.h"

namespace ddprun::launcher {

std::string substitute_local_rank(const std::string& arg, int local_rank) {
  const std::string rank = std::to_string(local_rank);
  auto ident_char = [](char ch, bool first) {
    return ch == '_' || std::isalpha(static_cast<unsigned char>(ch)) ||
           (!first && std::isdigit(static_cast<unsigned char>(ch)));
  };
  std::string out;
  for (size_t i = 0; i < arg.size();) {
    if (arg[i] != '$' || i + 1 == arg.size()) {
      out += arg[i++];
      continue;
    }
    if (arg[i + 1] == '$') {  // "$$" is an escaped "$"
      out += '$';
      i += 2;
      continue;
    }
    bool braced = arg[i + 1] == '{';
    size_t start = i + 1 + (braced ? 1 : 0), end = start;
    while (end < arg.size() && ident_char(arg[end], end == start)) ++end;
    std::string name = arg.substr(start, end - start);
    bool closed = !braced || (end < arg.size() && arg[end] == '}');
    if (name == "local_rank" && closed) {
      out += rank;
      i = end + (braced ? 1 : 0);
    } else {
      out += arg[i++];
    }
  }
  return out;
}

size_t LaunchConfig::interpreter_args() const {
  return no_python && !run_path ? 0 : 2;
}

std::vector<std::string> LaunchConfig::worker_argv(int local_rank) const {
  std::vector<std::string> argv;
  if (no_python && !run_path) {
    argv.push_back(training_script);
  } else {
    argv = {python, "-u"};
    if (module && !run_path) argv.push_back("-m");
    argv.push_back(substitute_local_rank(training_script, local_rank));
  }
  if (!local_rank_arg.empty()) argv.push_back(local_rank_arg + "=" + std::to_string(local_rank));
  for (const auto& a : training_script_args) argv.push_back(substitute_local_rank(a, local_rank));
  return argv;
}

}  // namespace ddprun::launcher
