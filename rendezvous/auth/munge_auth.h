// MungeAuth: StoreAuth (rendezvous/store/store_auth.h) with MUNGE credentials (Debian's libmunge), for the
// agents of one Slurm job: no secret file. Each side's proof is a credential from its node's munged whose
// payload binds the role, the job and both nonces; the other side decodes it through its own munged (every
// node of a Slurm cluster shares one MUNGE key), which also says which user made it. A credential of another
// user, made for another job or another handshake, encoded with another key, expired or replayed is refused,
// and `why` names which.
//
// Threads: immutable; libmunge opens its own connection to munged for every call (thread-safe). Each proof or
// verify blocks for a round trip to the local munged (0.1-0.3 ms here; docs/benchmarks.md).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "rendezvous/auth/handshake_parts.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::rdzv {

class MungeAuth final : public StoreAuth {
 public:
  // `socket`: munged's socket ("" = libmunge's default, /run/munge/munge.socket.2). `job`: what names the
  // job in every credential (the launcher: "Slurm job <SLURM_JOB_ID>, run <rdzv_id>"). The job's user is
  // this process's real uid.
  MungeAuth(std::string socket, std::string job);

  std::string nonce() const override { return random_nonce(); }
  std::string proof(std::string_view role, std::string_view client_nonce,
                    std::string_view store_nonce) const override;
  bool verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
              std::string_view given, std::string& why) const override;
  std::string what() const override;

  // "" when munged answers (a credential made and decoded); else what is wrong, naming the socket.
  std::string check() const;
  const std::string& socket() const { return socket_; }

 private:
  std::string socket_;
  std::string job_;
  uid_t uid_;
};

// The socket of munged as Slurm's auth/munge plugin finds it: the `socket=` of AuthInfo in `slurm_conf`
// (AuthInfo=socket=/run/munge/alt.socket,ttl=60); "" when the file cannot be read or names none.
std::string slurm_munge_socket(const std::filesystem::path& slurm_conf);

}  // namespace ddprun::rdzv
