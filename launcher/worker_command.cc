// The command line of each worker (LaunchConfig::worker_argv): torchrun's modes, ${local_rank} in the
// arguments, and ddprun-launch's --local-rank=N. Declared in launcher/launch_config.h.
#include <cctype>
#include <string>
#include <vector>

#include "launcher/launch_config.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {

std::string substitute_local_rank(const std::string& arg, int local_rank) {
  return template_substitute(arg, {{"local_rank", std::to_string(local_rank)}});
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
