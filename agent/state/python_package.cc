#include "agent/state/python_package.h"

namespace ddprun::agent {

const std::vector<std::pair<std::string, std::string>>& state_python_package() {
  static const std::vector<std::pair<std::string, std::string>> files = {
      {
          "ddprun/__init__.py",
#include "state_python_init.inc"
      },
      {
          "ddprun/state.py",
#include "state_python_state.inc"
      },
      {
          "ddprun/checkpoint.py",
#include "state_python_checkpoint.inc"
      },
  };
  return files;
}

}  // namespace ddprun::agent
