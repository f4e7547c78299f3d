#include "launcher/store_auth_setup.h"

#include <chrono>
#include <optional>
#include <stdexcept>
#include <thread>

#include "launcher/flag_values.h"
#include "rendezvous/auth/hmac_auth.h"
#include "rendezvous/auth/munge_auth.h"

namespace ddprun::launcher {

namespace {

std::string munge_socket(const std::map<std::string, std::string>& env) {
  if (std::string socket = env_or(env, "DDPRUN_MUNGE_SOCKET"); !socket.empty()) return socket;
  return rdzv::slurm_munge_socket(env_or(env, "SLURM_CONF", "/etc/slurm/slurm.conf"));
}

// munged's check, tried `tries` times a second apart: "" once it passes, else the last reason.
std::string check_munged(const rdzv::MungeAuth& munge, int tries) {
  std::string why;
  for (int i = 0; i < tries; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    why = munge.check();
    if (why.empty()) return "";
  }
  return why + (tries > 1 ? " (checked " + std::to_string(tries) + " times, a second apart)" : "");
}

}  // namespace

AuthSetup setup_store_auth(AuthMode mode, const std::filesystem::path& secret_file, const std::string& run_id,
                           const std::map<std::string, std::string>& env, int munge_checks) {
  AuthSetup setup;
  if (!secret_file.empty()) {
    if (mode != AuthMode::kAuto) {
      throw std::runtime_error(std::string("--rdzv_secret_file and --rdzv_auth ") +
                               (mode == AuthMode::kMunge ? "munge" : "none") +
                               " contradict each other: give one (docs/security.md)");
    }
    setup.auth = std::make_shared<rdzv::HmacAuth>(rdzv::read_secret_file(secret_file));
    setup.note = "the job's store admits only agents that hold the secret of " + secret_file.string();
    return setup;
  }
  const std::string job_id = env_or(env, "SLURM_JOB_ID");
  if (mode == AuthMode::kNone || (mode == AuthMode::kAuto && job_id.empty())) return setup;
  const std::string job = (job_id.empty() ? "" : "Slurm job " + job_id + ", ") + "run " + run_id;
  const std::string socket = munge_socket(env);
  using Use = rdzv::MungeAuth::Use;
  auto munge = std::make_shared<rdzv::MungeAuth>(socket, job,
                                                 mode == AuthMode::kMunge ? Use::kRequired : Use::kFollow);
  if (std::string why = check_munged(*munge, munge_checks); !why.empty()) {
    if (mode == AuthMode::kMunge) {
      throw std::runtime_error("--rdzv_auth munge: " + why +
                               " (start munged, or name its socket with DDPRUN_MUNGE_SOCKET)");
    }
    setup.warning =
        "under Slurm, but MUNGE cannot authenticate this node (" + why +
        "): the stores this node hosts are open to anyone who reaches their port; it follows the job's "
        "store: "
        "it joins an open one, and checks munged again when the store requires MUNGE (docs/security.md; "
        "--rdzv_auth none silences this)";
    setup.auth = std::make_shared<rdzv::MungeAuth>(socket, job, Use::kFollowUnchecked);
    return setup;
  }
  setup.note = "the job's store admits only agents with " + munge->what() + " (munged at " +
               (munge->socket().empty() ? std::string("its default socket") : munge->socket()) + ")";
  setup.auth = std::move(munge);
  return setup;
}

}  // namespace ddprun::launcher
