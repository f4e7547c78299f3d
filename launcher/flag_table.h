// The flags of ddprun's command line, kept as data: every spelling, the PET_ variable that stands for an
// absent flag, the --help line and the default. The LaunchConfig parser (launcher/launch_config.cc) registers
// them with CLI11 and reads them back by their canonical spelling; what each one means is decided by its
// passes.
//
// Pure data; thread-safe.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

struct FlagSpec {
  enum class Kind { kValue, kSwitch };  // takes a value / present or not (PET_<NAME> an integer, 0 = absent)
  Kind kind;
  const char* names;         // CLI11's spellings: "-r,--redirects", "--nproc_per_node,--nproc-per-node"
  const char* pet;           // PET_<pet> is read when the flag is absent; "" = no such variable
  const char* help;          // --help's text (the PET_ variable is added to it)
  const char* default_text;  // kValue: the value when neither given nor derived from Slurm ("" = none)
  bool launch_only;          // only under the name ddprun-launch (torch.distributed.launch's own flags)
};

// Every flag, in --help's order.
std::span<const FlagSpec> flag_table();

// The spelling a flag is known by: its first "--" name ("-r,--redirects" -> "--redirects").
std::string canonical_flag(std::string_view names);

// argparse's abbreviation look-up: for each flag (of ddprun, plus ddprun-launch's own when launch_mode, plus
// --help) that has a "--" spelling starting with `prefix`, those spellings, canonical one first when it
// matches. Empty when none does.
std::vector<std::vector<std::string>> flags_starting_with(std::string_view prefix, bool launch_mode);

}  // namespace ddprun::launcher
