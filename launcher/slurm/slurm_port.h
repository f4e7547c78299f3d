// The store port of a Slurm step when no port was given: a fixed sequence of candidates (from the job id,
// launcher/slurm/slurm_env.h), probed.
//
// Agent 0 hosts the store on the first candidate it can bind and then sets kSlurmStepKey = its step token.
// Every other agent walks the same sequence on agent 0's host and takes the first candidate whose store
// holds its own token - a port held by another program, by another job's ddprun or by another step of the
// same job is skipped. Agents that start before agent 0 keep walking the sequence (each connection attempt
// bounded, the bound growing from 0.25 s to 1 s per sweep) until their deadline.
//
// Probing talks to whatever listens on a candidate port of agent 0's host: it connects, sends the modern
// TCPStore handshake (VALIDATE, PING) and reads one key; it sets no key in a store that is not this step's.
//
// Blocking, with deadlines; thread-safe (no shared state). Errors: rdzv::BindError when agent 0 can bind
// none of the candidates (the message names them all); rdzv::TimeoutError when no candidate carries the
// token before the deadline (the message names host, ports and token); errors of `make` other than
// BindError propagate.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/store/store_auth.h"

namespace ddprun::launcher {

using RendezvousFactory = std::function<std::unique_ptr<rdzv::RendezvousHandler>(uint16_t port)>;

struct HostedRendezvous {
  std::unique_ptr<rdzv::RendezvousHandler> rendezvous;
  uint16_t port = 0;
};

// Agent 0: `make(port)` builds a rendezvous that hosts its store on `port` (and throws rdzv::BindError when
// the port is taken). Tries the candidates in order, then writes `token` into the store at `host`:port.
// `auth`: the job's authentication (launcher/store_auth_setup.h; null: an open store), for that write and
// for the probes below: a store that requires it admits no unauthenticated agent.
HostedRendezvous host_on_first_free_port(const std::string& host, const std::vector<uint16_t>& ports,
                                         const std::string& token, const RendezvousFactory& make,
                                         std::shared_ptr<const rdzv::StoreAuth> auth = nullptr);

// Other agents: the candidate whose store at `host` holds `token`. A store that refuses this agent's
// authentication (another job's) is passed over like a store of another step.
uint16_t find_step_store(const std::string& host, const std::vector<uint16_t>& ports,
                         const std::string& token, std::chrono::milliseconds timeout,
                         std::shared_ptr<const rdzv::StoreAuth> auth = nullptr);

}  // namespace ddprun::launcher
