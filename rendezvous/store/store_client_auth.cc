// StoreClient::authenticate (store_client.h): the agent's side of AUTH (store_auth.h) on a fresh connection.
#include <spdlog/spdlog.h>

#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_client_connection.h"

namespace ddprun::rdzv {

void StoreClient::authenticate(Connection& conn, std::chrono::steady_clock::time_point deadline) {
  const StoreAuth& auth = *options_.auth;
  const std::string client_nonce = auth.nonce();
  if (client_nonce.empty()) {
    throw AuthenticationError("no random bytes for the handshake with the store at " + endpoint_ +
                              " (the system's random source failed)");
  }
  std::string out;
  encode_request(Dialect::kModern, Request{.op = Op::kAuth, .values = {client_nonce}, .number = 1}, out);
  std::string store_nonce, store_proof;
  try {
    conn.write(out, deadline, "AUTH");
    store_nonce = conn.read_bytes(StoreAuth::kMaxProofBytes, deadline, "AUTH");
    store_proof = conn.read_bytes(StoreAuth::kMaxProofBytes, deadline, "AUTH");
  } catch (const ConnectionLostError& e) {
    throw AuthenticationError("the store at " + endpoint_ + " closed the connection at AUTH (" + e.what() +
                              "): a ddprun store older than store authentication, or not a ddprun store");
  }
  if (store_nonce.empty() && store_proof.empty()) {
    if (!auth.joins_open_store()) {
      throw AuthenticationError("the store at " + endpoint_ + " is open but this agent proves " +
                                auth.what() +
                                ": start every agent of the job, and ddprun-store, with the same "
                                "authentication (docs/security.md)");
    }
    // Said once per process; a node whose own stores are open (its munged failed) said so at its start.
    if (auth.store_requires() && auth.first_open_store()) {
      spdlog::warn(
          "the store at {} is open (its host's munged did not answer, or it runs with --rdzv_auth none): "
          "this "
          "agent joins it without authentication, as --rdzv_auth auto does: the job's store is open to "
          "anyone who reaches its port (docs/security.md; --rdzv_auth munge makes this an error)",
          endpoint_);
    }
    return;
  }
  if (std::string why = auth.ready_to_prove(deadline); !why.empty()) {
    throw AuthenticationError("the store at " + endpoint_ + " requires " + auth.what() +
                              " (its host decided so), but this node cannot make one: " + why +
                              ": start munged on this node, or run every agent of the job with "
                              "--rdzv_auth none (docs/security.md)");
  }
  if (std::string why; !auth.verify(StoreAuth::kStore, client_nonce, store_nonce, store_proof, why)) {
    throw AuthenticationError(
        "the store at " + endpoint_ + " is not this job's: " + why +
        " (another job's store at this endpoint, or the agents' authentication differs)");
  }
  const std::string_view role = options_.observer ? StoreAuth::kObserver : StoreAuth::kAgent;
  std::string proof;
  try {
    proof = auth.proof(role, client_nonce, store_nonce);
  } catch (const std::runtime_error& e) {
    throw AuthenticationError("this " + std::string(role) + " cannot prove " + auth.what() +
                              " to the store at " + endpoint_ + ": " + e.what());
  }
  out.clear();
  encode_request(Dialect::kModern,
                 Request{.op = Op::kAuth, .values = {proof}, .number = options_.observer ? 3u : 2u}, out);
  try {
    conn.write(out, deadline, "AUTH");
    if (conn.read_value<uint8_t>(deadline, "AUTH") != 1) throw ConnectionLostError("an unexpected answer");
  } catch (const ConnectionLostError& e) {
    throw AuthenticationError("the store at " + endpoint_ + " refused this " + std::string(role) +
                              "'s proof of " + auth.what() + " (" + e.what() + "): the store's log says why");
  }
}

}  // namespace ddprun::rdzv
