// StoreAuth: how a store and its agents prove that they belong to the job (docs/security.md), without a
// secret crossing the wire. The store needs only this interface; the implementations live in
// rendezvous/auth/, a library of its own (the store the worker SDK ships links neither OpenSSL nor libmunge):
// HMAC-SHA256 over the job's secret file (hmac_auth.h) and, under Slurm, MUNGE credentials (munge_auth.h).
//
// The handshake, a ddprun extension of the TCPStore protocol (command byte 0xDD, AUTH, in every dialect;
// torch's clients never send it; docs/wire-protocol.md):
//   client -> AUTH phase 1, value: its nonce (kNonceBytes random bytes)
//   store  <- bytes: the store's nonce, bytes: proof("store", client nonce, store nonce)
//   client -> AUTH phase 2, value: proof("agent", client nonce, store nonce)
//             or phase 3, value: proof("observer", ...): `ddprun status`, which may read but not write
//   store  <- u8 1; a wrong proof closes the connection instead
// Each side checks the other's proof, so an agent also knows that the store at its endpoint is its job's. A
// store without a secret answers phase 1 with two empty values: an agent that has a secret then refuses it,
// unless its auth joins_open_store() (--rdzv_auth auto under Slurm: the agents follow the store's host).
// Every AUTH value (a nonce, a proof) is at most kMaxProofBytes: a store refuses a longer one before it is
// buffered, and an agent a store's proof that is longer.
//
// Threads: every method is thread-safe (the mutable flags are atomic). nonce() and verify()
// never throw: the store calls them on its event loop's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace ddprun::rdzv {

class StoreAuth {
 public:
  static constexpr size_t kNonceBytes = 32;
  static constexpr size_t kMaxProofBytes = 4096;
  // The roles a proof is made for; the proof names its role, so that one role's cannot pass for another's.
  static constexpr std::string_view kStore = "store";
  static constexpr std::string_view kAgent = "agent";
  static constexpr std::string_view kObserver = "observer";

  virtual ~StoreAuth() = default;
  // kNonceBytes fresh random bytes; "" when no random bytes could be had (the handshake is then refused).
  virtual std::string nonce() const noexcept = 0;
  // The proof by `role` over both nonces. Throws std::runtime_error when it cannot be made (MUNGE: munged
  // does not answer).
  virtual std::string proof(std::string_view role, std::string_view client_nonce,
                            std::string_view store_nonce) const = 0;
  // Whether `given` proves, for `role` over both nonces, what this side holds; else false and `why` says
  // what was wrong (in time independent of where an HMAC differs).
  virtual bool verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
                      std::string_view given, std::string& why) const noexcept = 0;
  // What the agents prove, for messages: "the job's secret (--rdzv_secret_file)".
  virtual std::string what() const = 0;

  // Whether proof() and verify() block for a round trip to a daemon (MUNGE): a store then runs them on its
  // auth workers, never on its event loop's thread. False: a few microseconds of CPU (HMAC), run inline.
  virtual bool blocks() const noexcept { return false; }
  // Whether a store with this auth requires the proof. False: the store is open, as without a StoreAuth
  // (MUNGE under --rdzv_auth auto on a node whose munged failed its check: the store's host decides).
  virtual bool store_requires() const noexcept { return true; }
  // An agent's side, when the store at its endpoint is open: true joins it (the caller says so once, see
  // first_open_store()); false refuses it (AuthenticationError), so that a job is never half protected.
  virtual bool joins_open_store() const noexcept { return false; }
  // An agent's side, before it proves itself to a store that asked: "" when it can; else why not. May block
  // until `deadline` (MUNGE under auto on a node whose munged failed its check retries the check).
  virtual std::string ready_to_prove(std::chrono::steady_clock::time_point /*deadline*/) const { return ""; }

  // True the first time it is called on this object, false after: an agent that joins open stores says so
  // once, however many connections it opens.
  bool first_open_store() const noexcept { return !open_store_seen_.exchange(true); }

 private:
  mutable std::atomic<bool> open_store_seen_{false};
};

}  // namespace ddprun::rdzv
