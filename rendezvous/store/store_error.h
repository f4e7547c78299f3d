// Typed errors raised by the rendezvous store (client and server side).
//
// Every error a caller can cause or meet on the network is one of these types, so that callers can react
// to the category (retry on ConnectionLostError, give up on TimeoutError, ...) without parsing messages.
// Messages always name the peer as "addr:port" and the operation that failed.
#pragma once

#include <stdexcept>
#include <string>

namespace ddprun::rdzv {

// Base class: catch this to handle every store failure.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A deadline passed: connect, a reply, or a WAIT on keys that did not appear in time.
class TimeoutError : public StoreError {
 public:
  using StoreError::StoreError;
};

// A WAIT whose keys did not appear within its timeout: the expected outcome of a bounded wait, not a store
// that failed to answer (a stalled store gives a plain TimeoutError).
class WaitTimeoutError : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

// The store accepted the connection but did not answer the modern dialect's handshake in time: stalled, or a
// torch 1.13/2.0 TCPStore (which takes the handshake for the start of a legacy request and waits for more).
class HandshakeTimeoutError : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

// The peer closed or reset the connection, or it could not be established.
class ConnectionLostError : public StoreError {
 public:
  using StoreError::StoreError;
};

// The store and this client do not share the job's secret (StoreClientOptions::auth, store_auth.h): the store
// refused the client's proof, gave a wrong proof of its own (another job's store), or has no secret at all.
// Not retried: another try gives the same answer.
class AuthenticationError : public StoreError {
 public:
  using StoreError::StoreError;
};

// The local object was closed (StoreClient::close) or the server is shutting down.
class ClosedError : public StoreError {
 public:
  using StoreError::StoreError;
};

// The peer sent bytes that are not a valid reply (wrong type byte, absurd length, ...).
class BadReplyError : public StoreError {
 public:
  using StoreError::StoreError;
};

// A request was refused before it was sent (key or value above the limits, mismatched sizes, ...),
// or a server-side operation was invalid (ADD on a value that is not an integer).
class InvalidArgumentError : public StoreError {
 public:
  using StoreError::StoreError;
};

// The server could not bind or listen ("address in use", no such address).
class BindError : public StoreError {
 public:
  using StoreError::StoreError;
};

}  // namespace ddprun::rdzv
