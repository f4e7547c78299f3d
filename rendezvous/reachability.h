// Reachability of a TCP endpoint without speaking to it: is anything listening there, and which of this
// machine's addresses would a peer see when this node connects there.
//
// A refused connection (RST) means nothing listens at the endpoint: the process that served it is gone, while
// its host's kernel still answers. A frozen (SIGSTOPped) process still accepts: the kernel completes the
// handshake into the listen backlog. A host whose kernel is gone, or a dropped network, gives no answer at
// all. The store failover (store_failover.h) relies on that difference: only the first is proof of death.
// Thread-safe; every call blocks at most its timeout (name resolution excepted, as for every connect here).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ddprun::rdzv {

enum class Reach {
  kOpen,     // the connection was accepted (the peer may still not answer requests: frozen or busy)
  kRefused,  // nothing listens there (connection refused), or the name does not resolve
  kSilent,   // no answer to the handshake within the timeout (host down, network dropped, firewall)
};

// Tries one TCP connection to host:port (every address the name resolves to, in order) and closes it.
Reach probe_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

// The address of this machine that a connection to host:port would come from (the routing decision of the
// kernel; no packet is sent). "" when the host does not resolve or no route leads there.
std::string source_address_towards(const std::string& host, uint16_t port);

// A TCP port that is free on `address` (an address of this machine; "" = every address) now: bound to port 0,
// read back, released — torch's get_free_port, with its race (another program may take it before it is used).
// Throws BindError naming the address when nothing can be bound there.
uint16_t free_tcp_port(const std::string& address);

// True when `host` names or resolves to an address of this machine (loopback included).
bool is_local_host(const std::string& host);

}  // namespace ddprun::rdzv
