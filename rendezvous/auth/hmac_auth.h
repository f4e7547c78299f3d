// HmacAuth: StoreAuth (rendezvous/store/store_auth.h) with HMAC-SHA256 keyed by the job's secret, nonces from
// OpenSSL's RAND_bytes and CRYPTO_memcmp for comparisons. And the secret file of --rdzv_secret_file.
//
// Threads: HmacAuth is immutable and thread-safe; a proof costs a few microseconds of CPU, so the store runs
// it on its event loop (blocks() is false). read_secret_file reads the file system.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "rendezvous/auth/handshake_parts.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::rdzv {

class HmacAuth final : public StoreAuth {
 public:
  explicit HmacAuth(std::string secret) : secret_(std::move(secret)) {}
  std::string nonce() const noexcept override { return random_nonce(); }
  std::string proof(std::string_view role, std::string_view client_nonce,
                    std::string_view store_nonce) const override;
  bool verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
              std::string_view given, std::string& why) const noexcept override;
  std::string what() const override { return "the job's secret (--rdzv_secret_file)"; }

 private:
  std::string secret_;
};

// The secret of a --rdzv_secret_file: the file's bytes, surrounding blanks and newlines removed (a file made
// with `openssl rand -hex 32 > FILE` holds 64 characters and a newline). Like ssh with a private key, the
// file must be a regular file that neither its group nor others may read or write (mode 600 or 400), as found
// on the open file (fstat: no race with a rename). Throws std::runtime_error naming the file and what to do
// when it cannot be read, is open to others, is larger than 64 KiB or holds fewer than 16 bytes.
std::string read_secret_file(const std::filesystem::path& file);

}  // namespace ddprun::rdzv
