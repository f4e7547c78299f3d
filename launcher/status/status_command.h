// `ddprun status [--rdzv_endpoint H:P] [--rdzv_id ID] [--rdzv_backend c10d|static] [--master_addr A]
// [--master_port P] [--json] [--watch]`: prints a running job as its agents publish it
// (launcher/status/job_status.h; docs/observability.md). The endpoint and run id default as for a launch: PET_*
// variables, then torchrun's defaults (static: 127.0.0.1:29500; c10d: port 29400; run id "none"); inside a
// Slurm allocation (SLURM_JOB_ID) without them, the job id and the first host of the allocation with the
// ports a Slurm launch probes.
//
// Exit codes (docs/cli.md): 0 printed; 2 bad command line; 3 no store answers at the endpoint; 4 the store
// holds no status of that run id. --watch redraws every second until SIGINT (then 0).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ddprun::launcher {

// args: what follows "status" on the command line.
int status_main(const std::vector<std::string>& args, const std::map<std::string, std::string>& env);

}  // namespace ddprun::launcher
