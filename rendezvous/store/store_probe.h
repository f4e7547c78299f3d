// A short look at a store: is it there, and does it answer (the c10d failover's checks, the Slurm launch's
// search for its step's store, `ddprun status`). One place for what such a client is: bounded timeouts, no
// connect-retry log, the job's authentication.
//
// Thread-safe (no shared state). probe_store() blocks at most the options' connect_timeout plus the
// handshake's (at most `timeout`); a store that does not answer, refuses or is not the job's (a StoreError)
// is nullptr, with the reason, not an exception.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/store_auth.h"
#include "rendezvous/store/store_client.h"

namespace ddprun::rdzv {

// The longest connect_timeout a probe takes: its connect retries end before the client logs them (it warns
// after 10 s of retrying, store_client_connection.h), so a probe of a store that is gone says nothing.
constexpr std::chrono::milliseconds kMaxProbeConnectTimeout{9000};

// A client that connects within `connect_timeout` (at most kMaxProbeConnectTimeout) and waits at most
// `timeout` for each reply, proving `auth` (null: none) as an agent, or as an observer when `observer` (reads
// only; store_client.h).
StoreClientOptions probe_options(std::chrono::milliseconds connect_timeout, std::chrono::milliseconds timeout,
                                 std::shared_ptr<const StoreAuth> auth, bool observer = false);

// A connected (and authenticated) client of `store`; nullptr when it cannot be had, the StoreError's message
// in `why` when given.
std::unique_ptr<StoreClient> probe_store(const Endpoint& store, const StoreClientOptions& options,
                                         std::string* why = nullptr);

}  // namespace ddprun::rdzv
