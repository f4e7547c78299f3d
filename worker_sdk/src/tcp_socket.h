// TCP plumbing of the CPU backend: a listener, and connections made and accepted with deadlines, each
// starting with a hello (magic, group tag, rank) so that a stray or stale connection is never taken for a
// peer. Sockets are non-blocking, TCP_NODELAY, close-on-exec; sends use MSG_NOSIGNAL (no SIGPIPE).
//
// Errors: CollectiveError naming the peer rank and addr:port on failure or deadline; AbortSignal raised
// while waiting -> CollectiveError "aborted". IPv4 only.
#pragma once

#include <cstdint>
#include <string>

#include "abort_signal.h"
#include "deadline.h"
#include "rendezvous/util/unique_fd.h"

namespace ddprun::sdk {

using ddprun::UniqueFd;

// Listens on 0.0.0.0, port 0 (any free port).
class TcpListener {
 public:
  TcpListener();  // throws std::system_error
  uint16_t port() const { return port_; }
  // Accepts connections until one says hello with `tag` from rank `expected_rank`; others are closed.
  UniqueFd accept_peer(uint64_t tag, int expected_rank, const AbortSignal& abort, const Deadline& deadline);

 private:
  UniqueFd fd_;
  uint16_t port_ = 0;
};

// Connects to host:port (retrying refused connections until the deadline) and says hello as `my_rank`.
UniqueFd connect_peer(const std::string& host, uint16_t port, int peer_rank, uint64_t tag, int my_rank,
                      const AbortSignal& abort, const Deadline& deadline);

// The local IPv4 address the kernel would use to reach `host` ("" when it cannot tell).
std::string local_address_towards(const std::string& host);

}  // namespace ddprun::sdk
