// Constructors of the process-group backends. Most programs call ddprun::sdk::init() instead.
//
// Both bootstrap through a store shared by all ranks (keys under `prefix`, which must be unique per group
// instance: a new prefix for every group and every restart), blocking until every rank has joined or
// options.timeout passes (CollectiveError naming a rank that did not show up).
#pragma once

#include <memory>
#include <string>

#include "ddprun/process_group.h"
#include "ddprun/rdzv/store.h"

namespace ddprun::sdk {

// CPU backend: a shared-memory path among the ranks of one host (POSIX shm, lock-free progress counters),
// a bandwidth-optimal ring (reduce-scatter + all-gather, chunked and pipelined) over TCP between hosts, and
// both combined when hosts have several ranks (reduce within the host, ring among one leader per host,
// broadcast within the host). Host buffers only. Ranks count as one host when hostname, boot id and pid
// namespace agree (options.host_id overrides; options.cpu_transport = kTcp forces the ring everywhere).
// A rank that dies is detected within milliseconds (TCP EOF/reset, or its pid gone for shared memory).
std::unique_ptr<ProcessGroup> make_cpu_process_group(rdzv::Store& store, const std::string& prefix, int rank,
                                                     int size, const ProcessGroupOptions& options = {});

// NCCL backend (built when DDPRUN_WITH_NCCL is on; otherwise throws std::runtime_error saying so): one
// communicator on CUDA device `device`, ncclUniqueId exchanged through the store, its own CUDA stream,
// async-error polling and ncclCommAbort on timeout or peer loss. Device buffers only, on `device`; the
// writes that produced a buffer must be complete when a collective is called (the group's stream does not
// wait for other streams).
std::unique_ptr<ProcessGroup> make_nccl_process_group(rdzv::Store& store, const std::string& prefix, int rank,
                                                      int size, int device,
                                                      const ProcessGroupOptions& options = {});
// True when ddprun was built with NCCL and at least one CUDA device is visible (init()'s kAuto uses it).
bool nccl_available();

// A group of one rank (no communication): what a program gets when it runs without a launcher.
std::unique_ptr<ProcessGroup> make_single_process_group();

}  // namespace ddprun::sdk
