#include "rendezvous/auth/handshake_parts.h"

#include <openssl/rand.h>

#include "rendezvous/store/store_auth.h"

namespace ddprun::rdzv {

namespace {

constexpr std::string_view kContext = "ddprun store auth v1";

}  // namespace

std::string random_nonce() noexcept {
  std::string out(StoreAuth::kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1) return "";
  return out;
}

std::string auth_message(std::initializer_list<std::string_view> parts) {
  std::string message = std::to_string(kContext.size()) + ":" + std::string(kContext);
  for (std::string_view part : parts) {
    message += std::to_string(part.size()) + ":";
    message += part;
  }
  return message;
}

}  // namespace ddprun::rdzv
