#include "rendezvous/auth/hmac_auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
                      std::string_view given, std::string& why) const noexcept {
  std::string expected;
  try {
    expected = proof(role, client_nonce, store_nonce);
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
  if (given.size() == expected.size() && CRYPTO_memcmp(given.data(), expected.data(), given.size()) == 0) {
    return true;
  }
  why = "a wrong proof of the job's secret (the --rdzv_secret_file differ)";
  return false;
}

namespace {

constexpr size_t kMaxSecretFileBytes = 64 * 1024;

std::string make_one(const std::filesystem::path& file) {
  return "(make one with: (umask 077; openssl rand -hex 32 > " + file.string() + "))";
}

// Closes the descriptor when it goes.
struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_secret_file(const std::filesystem::path& file) {
  // O_NONBLOCK: a FIFO in its place does not block the start; it is refused below.
  FileDescriptor f{::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
  if (f.fd < 0) {
    throw std::runtime_error("cannot read the job's secret file " + file.string() + ": " +
                             std::strerror(errno) + " " + make_one(file));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    throw std::runtime_error("cannot read the job's secret file " + file.string() + ": " +
                             std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw std::runtime_error("the job's secret file " + file.string() + " is not a regular file");
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw std::runtime_error("the job's secret file " + file.string() + " has mode " + mode +
                             ": its group or other users may read or change it, and whoever reads it can "
                             "join and stop the job; make it private: chmod 600 " +
                             file.string());
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxSecretFileBytes) {
    throw std::runtime_error("the job's secret file " + file.string() + " holds " +
                             std::to_string(st.st_size) + " bytes, more than a secret (64 KiB at most)");
  }
  std::string text;
  char buf[4096];
  while (text.size() <= kMaxSecretFileBytes) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw std::runtime_error("cannot read the job's secret file " + file.string() + ": " +
                               std::strerror(errno));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  std::string secret = trim(text);
  if (secret.size() < kMinSecretBytes) {
    throw std::runtime_error("the job's secret file " + file.string() + " holds " +
                             std::to_string(secret.size()) + " bytes, fewer than " +
                             std::to_string(kMinSecretBytes) + " " + make_one(file));
  }
  return secret;
}

}  // namespace ddprun::rdzv
