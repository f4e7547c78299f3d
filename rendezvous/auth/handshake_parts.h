// What every StoreAuth of rendezvous/auth/ shares: the handshake's nonces and the message a proof covers.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace ddprun::rdzv {

// StoreAuth::kNonceBytes from OpenSSL's RAND_bytes; "" when it has none (StoreAuth::nonce()).
std::string random_nonce() noexcept;
// What a proof covers: the handshake's version tag, then the parts, each with its length (no two different
// inputs read the same).
std::string auth_message(std::initializer_list<std::string_view> parts);

}  // namespace ddprun::rdzv
