// How the job's store authenticates its agents (docs/security.md), from --rdzv_auth and --rdzv_secret_file:
// the job's secret file (HMAC), MUNGE credentials under Slurm, or an open store. One choice for a launch and
// for `ddprun status`.
//
//   --rdzv_auth auto   (default) the secret file when one is given; else, under Slurm, MUNGE when munged
//                      answers (when it does not: an open store and a warning); else open
//   --rdzv_auth munge  MUNGE, required: munged must answer
//   --rdzv_auth none   open, even under Slurm (a job with torchrun agents, a store ddprun-store serves open)
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "launcher/launch_config.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::launcher {

struct AuthSetup {
  std::shared_ptr<const rdzv::StoreAuth> auth;  // null: open
  std::string note;                             // what was chosen, for the log
  std::string warning;                          // a secret file others may read; munged silent under auto
};

// `slurm`: this agent runs as a task of a Slurm job (SLURM_JOB_ID names it). `run_id`: the job's --rdzv_id.
// munged's socket: $DDPRUN_MUNGE_SOCKET, else AuthInfo's socket= in $SLURM_CONF (default
// /etc/slurm/slurm.conf), else libmunge's default. Throws std::runtime_error naming the flag to fix: a secret
// file that cannot be read, a secret file with --rdzv_auth munge or none, munged silent with munge.
AuthSetup setup_store_auth(AuthMode mode, const std::filesystem::path& secret_file, bool slurm,
                           const std::string& run_id, const std::map<std::string, std::string>& env);

}  // namespace ddprun::launcher
