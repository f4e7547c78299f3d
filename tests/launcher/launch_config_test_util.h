// Shared by the launch_config tests: parse a command line (with an environment and a GPU count) and print
// parts of the result.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/launch_config.h"

namespace ddprun::launcher::test {

using Env = std::map<std::string, std::string>;
using Args = std::vector<std::string>;

struct Outcome {
  ParseResult result;
  LaunchConfig config;
  int gpu_calls = 0;
};

inline Outcome parse(const Args& args, const Env& env = {}, int gpus = 0) {
  Args argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  Outcome o;
  o.result = parse_launch_config(
      argv, env,
      [&] {
        ++o.gpu_calls;
        return gpus;
      },
      o.config);
  return o;
}

inline std::string join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

inline std::string describe(const StdSpec& s) {
  if (s.per_rank.empty()) return std::to_string(static_cast<int>(s.all));
  std::vector<std::string> parts;
  for (const auto& [rank, std] : s.per_rank)
    parts.push_back(std::to_string(rank) + ":" + std::to_string(int(std)));
  return join(parts, ",");
}


}  // namespace ddprun::launcher::test
