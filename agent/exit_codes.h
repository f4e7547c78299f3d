// The exit codes of ddprun (the launcher and its agent), in one place. docs/cli.md documents them for users.
//
// Besides these, the agent exits with a worker's own code: the first failing worker's exit code, or 128+N
// when signal N killed it, or when signal N stopped the job (unless --slurm maps it to
// kExitSlurmInterrupted).
#pragma once

namespace ddprun::agent {

enum ExitCode : int {
  kExitSuccess = 0,
  kExitInternal = 1,          // a bug in ddprun (an unexpected exception); the workers were stopped
  kExitUsage = 2,             // bad command line or configuration (nothing was started)
  kExitStoreFailed = 3,       // the store could not listen (port in use) or was lost
  kExitRendezvousFailed = 4,  // join timeout, unreachable endpoint, closed rendezvous, duplicate node rank
  kExitSpawnFailed = 5,       // a worker could not be started (program not found, log dir unwritable)
  kExitHung = 6,              // --hang_timeout: no rank made progress (after the last restart)
  // --max_no_progress_restarts: restarts that made no progress; do not requeue (Slurm, Kubernetes'
  // podFailurePolicy).
  kExitNoProgress = 7,
  // The node failed --health_check_attempts health checks in a row (agent/health/health_check.h): this
  // machine needs attention; the job may go on without it.
  kExitUnhealthy = 8,
  // Under Slurm: SIGTERM/SIGUSR1/SIGUSR2 (scancel, preemption, time limit) stopped the job; it may be
  // requeued (EX_TEMPFAIL).
  kExitSlurmInterrupted = 75,
};

}  // namespace ddprun::agent
