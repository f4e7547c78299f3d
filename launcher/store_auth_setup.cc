#include "launcher/store_auth_setup.h"

#include <optional>
#include <stdexcept>

#include "launcher/flag_values.h"
#include "rendezvous/auth/hmac_auth.h"
#include "rendezvous/auth/munge_auth.h"

namespace ddprun::launcher {

namespace {

std::string munge_socket(const std::map<std::string, std::string>& env) {
  if (std::string socket = env_or(env, "DDPRUN_MUNGE_SOCKET"); !socket.empty()) return socket;
  return rdzv::slurm_munge_socket(env_or(env, "SLURM_CONF", "/etc/slurm/slurm.conf"));
}

}  // namespace

AuthSetup setup_store_auth(AuthMode mode, const std::filesystem::path& secret_file, bool slurm,
                           const std::string& run_id, const std::map<std::string, std::string>& env) {
  AuthSetup setup;
  if (!secret_file.empty()) {
    if (mode != AuthMode::kAuto) {
      throw std::runtime_error(std::string("--rdzv_secret_file and --rdzv_auth ") +
                               (mode == AuthMode::kMunge ? "munge" : "none") +
                               " contradict each other: give one (docs/security.md)");
    }
    setup.auth = std::make_shared<rdzv::HmacAuth>(rdzv::read_secret_file(secret_file, setup.warning));
    setup.note = "the job's store admits only agents that hold the secret of " + secret_file.string();
    return setup;
  }
  if (mode == AuthMode::kNone || (mode == AuthMode::kAuto && !slurm)) return setup;
  const std::string job_id = env_or(env, "SLURM_JOB_ID");
  const std::string job = (job_id.empty() ? "" : "Slurm job " + job_id + ", ") + "run " + run_id;
  auto munge = std::make_shared<rdzv::MungeAuth>(munge_socket(env), job);
  if (std::string why = munge->check(); !why.empty()) {
    if (mode == AuthMode::kMunge) {
      throw std::runtime_error("--rdzv_auth munge: " + why +
                               " (start munged, or name its socket with DDPRUN_MUNGE_SOCKET)");
    }
    setup.warning = "under Slurm, but MUNGE cannot authenticate the agents (" + why +
                    "): the job's store is open to anyone who reaches its port (docs/security.md; "
                    "--rdzv_auth none silences this)";
    return setup;
  }
  setup.note = "the job's store admits only agents with " + munge->what() + " (munged at " +
               (munge->socket().empty() ? std::string("its default socket") : munge->socket()) + ")";
  setup.auth = std::move(munge);
  return setup;
}

}  // namespace ddprun::launcher
