// Typed errors of the rendezvous (RendezvousHandler), a family of their own beside the store's
// (store_error.h): a caller tells "the job is over" from "nobody came" from "this agent is wrong" from "the
// store is gone" without parsing messages.
//
//   RendezvousError                 root: catch it to handle every rendezvous failure
//   ├─ RendezvousClosedError        the job finished: its rendezvous was closed (a late agent of that job)
//   ├─ RendezvousTimeoutError       not enough nodes joined within join_timeout (also when the store's host
//   │                               gave up first and took the store away); names who joined and the endpoint
//   ├─ RendezvousConflictError      this agent does not fit the job: its --node_rank is taken by another
//   agent, │  │                            or it reused the --rdzv_id and endpoint of another, running job │
//   └─ SpareNotNeededError       it waited as a hot spare (the job was full) and the job finished: the │
//   agent exits 0 (a spare of `srun -N N+k` must not fail the step) └─ RendezvousStoreError         the store
//   at H:P is unreachable, was lost, holds or sent something
//                                   unreadable, or did not answer for longer than the handler tolerates
// Every message names the run id and "the store at H:P" (or the endpoint) and, where the user can act, what
// to do. The agent turns each into exit code 4 during the rendezvous and 3 (store lost) while workers run
// (agent/exit_codes.h, docs/cli.md).
#pragma once

#include <stdexcept>
#include <string>

namespace ddprun::rdzv {

class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RendezvousClosedError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

class RendezvousTimeoutError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

class RendezvousConflictError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

class SpareNotNeededError : public RendezvousConflictError {
 public:
  using RendezvousConflictError::RendezvousConflictError;
};

class RendezvousStoreError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

}  // namespace ddprun::rdzv
