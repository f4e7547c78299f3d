#include "rendezvous/auth/hmac_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "rendezvous/auth/handshake_parts.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

namespace {

constexpr size_t kMinSecretBytes = 16;

}  // namespace

std::string HmacAuth::proof(std::string_view role, std::string_view client_nonce,
                            std::string_view store_nonce) const {
  const std::string message = auth_message({role, client_nonce, store_nonce});
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length)) {
    throw std::runtime_error("OpenSSL's HMAC-SHA256 failed in the store's handshake");
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

bool HmacAuth::verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
                      std::string_view given, std::string& why) const {
  const std::string expected = proof(role, client_nonce, store_nonce);
  if (given.size() == expected.size() && CRYPTO_memcmp(given.data(), expected.data(), given.size()) == 0) {
    return true;
  }
  why = "a wrong proof of the job's secret (the --rdzv_secret_file differ)";
  return false;
}

std::string read_secret_file(const std::filesystem::path& file, std::string& warning) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read the job's secret file " + file.string() + ": " +
                             std::strerror(errno) + " (make one with: (umask 077; openssl rand -hex 32 > " +
                             file.string() + "))");
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string secret = trim(text.str());
  if (secret.size() < kMinSecretBytes) {
    throw std::runtime_error("the job's secret file " + file.string() + " holds " +
                             std::to_string(secret.size()) + " bytes, fewer than " +
                             std::to_string(kMinSecretBytes) +
                             " (make one with: (umask 077; openssl rand -hex 32 > " + file.string() + "))");
  }
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    warning = "the job's secret file " + file.string() +
              " may be read by other users (chmod 600 it): whoever reads it can join and stop the job";
  }
  return secret;
}

}  // namespace ddprun::rdzv
