// StoreAuth: how a store and its agents prove that they hold the job's secret (docs/security.md), without the
// secret crossing the wire. The store needs only this interface; the HMAC-SHA256 implementation is
// rendezvous/auth/hmac_auth.h, a library of its own, so that the store the worker SDK ships links no OpenSSL.
//
// The handshake, a ddprun extension of the TCPStore protocol (command byte 0xDD, AUTH, in every dialect;
// torch's clients never send it; docs/wire-protocol.md):
//   client -> AUTH phase 1, value: its nonce (kNonceBytes random bytes)
//   store  <- bytes: the store's nonce, bytes: proof("store", client nonce, store nonce)
//   client -> AUTH phase 2, value: proof("agent", client nonce, store nonce)
//   store  <- u8 1; a wrong proof closes the connection instead
// Each side checks the other's proof, so an agent also knows that the store at its endpoint is its job's. A
// store without a secret answers phase 1 with two empty values: an agent that has a secret then refuses it.
//
// Threads: implementations are immutable after construction and thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace ddprun::rdzv {

class StoreAuth {
 public:
  static constexpr size_t kNonceBytes = 32;

  virtual ~StoreAuth() = default;
  // kNonceBytes fresh random bytes.
  virtual std::string nonce() const = 0;
  // The proof of the secret by `role` ("store" or "agent") over both nonces.
  virtual std::string proof(std::string_view role, std::string_view client_nonce,
                            std::string_view store_nonce) const = 0;
  // `a` == `b`, in time independent of where they differ.
  virtual bool same(std::string_view a, std::string_view b) const = 0;
};

}  // namespace ddprun::rdzv
