// StoreServerStats: what a running StoreServer reports (store_server.h), apart so that the rendezvous handler
// can hand it to the agent's metrics without the server's headers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "rendezvous/store/wire_codec.h"

namespace ddprun::rdzv {

struct StoreServerStats {
  size_t connections = 0;
  uint64_t accepted = 0;
  uint64_t refused = 0;       // closed at accept: over max_connections
  uint64_t dropped = 0;       // closed for misbehaviour (silent ones reclaimed included)
  uint64_t unauthorized = 0;  // closed by the admission of a store with a secret (StoreServerOptions::auth)
  // Closed before they authenticated (a store with a secret): from an address that is not the job's past its
  // handshake_timeout, over max_handshakes_per_address, or to make room at max_connections; or because the
  // queue of blocking AUTH steps was full.
  uint64_t handshakes_dropped = 0;
  uint64_t requests = 0;
  std::array<uint64_t, kOpCount> requests_by_op{};  // index: Op (op_name names it)
  int64_t keys = 0;
  size_t pending_waits = 0;
  size_t stored_bytes = 0;
  size_t buffered_bytes = 0;       // held for clients now (see memory_budget), shared_bytes included
  size_t shared_bytes = 0;         // of which stored values referenced by queued replies, each counted once
  size_t peak_buffered_bytes = 0;  // the most ever held at once
  size_t memory_budget = 0;        // StoreServerOptions::memory_budget in force
};

}  // namespace ddprun::rdzv
