// StoreClient::authenticate (store_client.h): the agent's side of AUTH (store_auth.h) on a fresh connection.
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_client_connection.h"

namespace ddprun::rdzv {

void StoreClient::authenticate(Connection& conn, std::chrono::steady_clock::time_point deadline) {
  const StoreAuth& auth = *options_.auth;
  const std::string client_nonce = auth.nonce();
  std::string out;
  encode_request(Dialect::kModern, Request{.op = Op::kAuth, .values = {client_nonce}, .number = 1}, out);
  std::string store_nonce, store_proof;
  try {
    conn.write(out, deadline, "AUTH");
    store_nonce = conn.read_bytes(1024, deadline, "AUTH");
    store_proof = conn.read_bytes(1024, deadline, "AUTH");
  } catch (const ConnectionLostError& e) {
    throw AuthenticationError("the store at " + endpoint_ + " closed the connection at AUTH (" + e.what() +
                              "): a ddprun store older than store authentication, or not a ddprun store");
  }
  if (store_nonce.empty() && store_proof.empty()) {
    throw AuthenticationError("the store at " + endpoint_ + " is open but this agent proves " + auth.what() +
                              ": start every agent of the job, and ddprun-store, with the same "
                              "authentication (docs/security.md)");
  }
  if (std::string why; !auth.verify("store", client_nonce, store_nonce, store_proof, why)) {
    throw AuthenticationError(
        "the store at " + endpoint_ + " is not this job's: " + why +
        " (another job's store at this endpoint, or the agents' authentication differs)");
  }
  std::string proof;
  try {
    proof = auth.proof("agent", client_nonce, store_nonce);
  } catch (const std::runtime_error& e) {
    throw AuthenticationError("this agent cannot prove " + auth.what() + " to the store at " + endpoint_ +
                              ": " + e.what());
  }
  out.clear();
  encode_request(Dialect::kModern, Request{.op = Op::kAuth, .values = {proof}, .number = 2}, out);
  try {
    conn.write(out, deadline, "AUTH");
    if (conn.read_value<uint8_t>(deadline, "AUTH") != 1) throw ConnectionLostError("an unexpected answer");
  } catch (const ConnectionLostError& e) {
    throw AuthenticationError("the store at " + endpoint_ + " refused this agent's proof of " + auth.what() +
                              " (" + e.what() + "): the store's log says why");
  }
}

}  // namespace ddprun::rdzv
