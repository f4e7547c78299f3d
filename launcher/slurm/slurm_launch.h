// Under Slurm, once every flag is resolved: which of Slurm's derived settings the launch used (a flag given
// overrides one; --dry-run prints the rest), the store's host and the ports to probe for it, and whether
// this agent hosts it. The derivation itself is slurm_env.h's; the parser's Slurm pass is launch_config.cc's.
#pragma once

#include <functional>
#include <string>

#include "launcher/launch_config.h"

namespace ddprun::launcher {

// Completes c.slurm (nothing without one). `given(flag)`: the flag was on the command line or in PET_*;
// master_port_given: --master_port (or MASTER_PORT) was, which fixes a static job's store port.
void finish_slurm_launch(LaunchConfig& c, const std::function<bool(const std::string&)>& given,
                         bool master_port_given);

}  // namespace ddprun::launcher
