// How the job's store authenticates its agents (docs/security.md), from --rdzv_auth and --rdzv_secret_file:
// the job's secret file (HMAC), MUNGE credentials under Slurm, or an open store. One choice for a launch and
// for `ddprun status`.
//
//   --rdzv_auth auto   (default) the secret file when one is given; else, under Slurm (SLURM_JOB_ID is set:
//                      inside a Slurm job's allocation, in Slurm mode or not), MUNGE, following the store's
//                      host: a node whose munged answers requires MUNGE of the stores it hosts; a node whose
//                      munged fails its check hosts open stores; either joins an open store with one warning,
//                      and a node whose munged failed checks again when a store requires MUNGE
//                      (MungeAuth::Use); else open
//   --rdzv_auth munge  MUNGE, required: munged must answer, and an open store is refused
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
  std::string warning;                          // munged failing its check under auto
};

// `run_id`: the job's --rdzv_id. munged's socket: $DDPRUN_MUNGE_SOCKET, else AuthInfo's socket= in
// $SLURM_CONF (default /etc/slurm/slurm.conf), else libmunge's default. munged's check is tried
// `munge_checks` times, a second apart, before it counts as failing. Throws std::runtime_error naming the
// flag to fix: a secret file that cannot be read or is open to others, a secret file with --rdzv_auth munge
// or none, munged failing with munge.
AuthSetup setup_store_auth(AuthMode mode, const std::filesystem::path& secret_file, const std::string& run_id,
                           const std::map<std::string, std::string>& env, int munge_checks = 3);

}  // namespace ddprun::launcher
