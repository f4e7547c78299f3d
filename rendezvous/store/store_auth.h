// StoreAuth: how a store and its agents prove that they belong to the job (docs/security.md), without a secret
// crossing the wire. The store needs only this interface; the implementations live in rendezvous/auth/, a
// library of its own (the store the worker SDK ships links neither OpenSSL nor libmunge): HMAC-SHA256 over the
// job's secret file (hmac_auth.h) and, under Slurm, MUNGE credentials (munge_auth.h).
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
  // The proof by `role` ("store" or "agent") over both nonces. Throws std::runtime_error when it cannot be
  // made (MUNGE: munged does not answer).
  virtual std::string proof(std::string_view role, std::string_view client_nonce,
                            std::string_view store_nonce) const = 0;
  // Whether `given` proves, for `role` over both nonces, what this side holds; else false and `why` says
  // what was wrong (in time independent of where an HMAC differs).
  virtual bool verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
                      std::string_view given, std::string& why) const = 0;
  // What the agents prove, for messages: "the job's secret (--rdzv_secret_file)".
  virtual std::string what() const = 0;
};

}  // namespace ddprun::rdzv
