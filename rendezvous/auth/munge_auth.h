// MungeAuth: StoreAuth (rendezvous/store/store_auth.h) with MUNGE credentials, for the agents of one Slurm
// job: no secret file. Each side's proof is a credential from its node's munged whose payload binds the role,
// the job (its SHA-256: a credential's size does not grow with --rdzv_id) and both nonces; the other side
// decodes it through its own munged (every node of a Slurm cluster shares one MUNGE key), which also says
// which user made it. A credential of another user, made for another job or another handshake, encoded with
// another key, expired or replayed is refused, and `why` names which. libmunge is loaded at run time
// (munge_library.h): without it every proof fails, saying so.
//
// Use (docs/security.md, "Under Slurm"):
//   kRequired         --rdzv_auth munge: its stores require credentials, and an open store is refused;
//   kFollow           --rdzv_auth auto, munged answered: its stores require credentials, and an open store
//   (its
//                     host's munged failed) is joined: the store's host decides for the job;
//   kFollowUnchecked  auto, munged failed its check: its stores are open; an open store is joined, and a
//   store
//                     that requires a credential makes it retry the check (ready_to_prove) before it proves.
//
// Threads: thread-safe (the one mutable flag, munged found answering, is atomic); libmunge opens its own
// connection to munged for every call. Each proof or verify blocks for a round trip to the local munged
// (0.1-0.3 ms here; docs/benchmarks.md): StoreAuth::blocks(), so the store runs them off its event loop.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>

#include "rendezvous/auth/handshake_parts.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::rdzv {

class MungeAuth final : public StoreAuth {
 public:
  enum class Use { kRequired, kFollow, kFollowUnchecked };
  // `socket`: munged's socket ("" = libmunge's default, /run/munge/munge.socket.2). `job`: what names the
  // job in every credential (the launcher: "Slurm job <SLURM_JOB_ID>, run <rdzv_id>"). The job's user is
  // this process's real uid. `retry_for`: how long ready_to_prove() retries the check (kFollowUnchecked).
  MungeAuth(std::string socket, std::string job, Use use = Use::kRequired,
            std::chrono::milliseconds retry_for = std::chrono::seconds(5));

  std::string nonce() const noexcept override { return random_nonce(); }
  std::string proof(std::string_view role, std::string_view client_nonce,
                    std::string_view store_nonce) const override;
  bool verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
              std::string_view given, std::string& why) const noexcept override;
  std::string what() const override;
  bool blocks() const noexcept override { return true; }
  bool store_requires() const noexcept override { return use_ != Use::kFollowUnchecked; }
  bool joins_open_store() const noexcept override { return use_ != Use::kRequired; }
  std::string ready_to_prove(std::chrono::steady_clock::time_point deadline) const override;

  // "" when munged answers (a credential made and decoded); else what is wrong, naming the socket.
  std::string check() const;
  const std::string& socket() const { return socket_; }
  Use use() const { return use_; }

 private:
  // The payload a credential of `role` carries for this job and these nonces.
  std::string payload(std::string_view role, std::string_view client_nonce,
                      std::string_view store_nonce) const;

  std::string socket_;
  std::string job_;
  std::string job_digest_;  // SHA-256 of job_, hex
  uid_t uid_;
  Use use_;
  std::chrono::milliseconds retry_for_;
  mutable std::atomic<bool> answered_;  // munged passed a check (kFollowUnchecked: not yet)
};

// The socket of munged as Slurm's auth/munge plugin finds it: the `socket=` of AuthInfo in `slurm_conf`
// (AuthInfo=socket=/run/munge/alt.socket,ttl=60); "" when the file cannot be read or names none.
std::string slurm_munge_socket(const std::filesystem::path& slurm_conf);

}  // namespace ddprun::rdzv
