// HmacAuth: StoreAuth (rendezvous/store/store_auth.h) with HMAC-SHA256 keyed by the job's secret, nonces from
// OpenSSL's RAND_bytes and CRYPTO_memcmp for comparisons. And the secret file of --rdzv_secret_file.
//
// Threads: HmacAuth is immutable and thread-safe. read_secret_file reads the file system.
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
  std::string nonce() const override { return random_nonce(); }
  std::string proof(std::string_view role, std::string_view client_nonce,
                    std::string_view store_nonce) const override;
  bool verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
              std::string_view given, std::string& why) const override;
  std::string what() const override { return "the job's secret (--rdzv_secret_file)"; }

 private:
  std::string secret_;
};

// The secret of a --rdzv_secret_file: the file's bytes, surrounding blanks and newlines removed (a file made
// with `openssl rand -hex 32 > FILE` holds 64 characters and a newline). Throws std::runtime_error naming
// the file when it cannot be read or holds fewer than 16 bytes. `warning` is set (else left empty) when
// users other than the owner may read it: the caller logs it.
std::string read_secret_file(const std::filesystem::path& file, std::string& warning);

}  // namespace ddprun::rdzv
