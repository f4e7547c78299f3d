#include "rendezvous/auth/hmac_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

namespace {

constexpr std::string_view kContext = "ddprun store auth v1";
constexpr size_t kMinSecretBytes = 16;

}  // namespace

std::string HmacAuth::nonce() const {
  std::string out(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1) {
    throw std::runtime_error("OpenSSL's RAND_bytes failed: no random bytes for the store's handshake");
  }
  return out;
}

std::string HmacAuth::proof(std::string_view role, std::string_view client_nonce,
                            std::string_view store_nonce) const {
  // Every field with its length: no two different inputs read the same.
  std::string message;
  for (std::string_view part : {kContext, role, client_nonce, store_nonce}) {
    message += std::to_string(part.size()) + ":";
    message += part;
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length)) {
    throw std::runtime_error("OpenSSL's HMAC-SHA256 failed in the store's handshake");
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

bool HmacAuth::same(std::string_view a, std::string_view b) const {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
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
