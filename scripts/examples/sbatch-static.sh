#!/bin/bash
# Multi-node DDP training with ddprun under Slurm, static rendezvous: one ddprun per node, each starting
# NPROC_PER_NODE workers. Nothing to derive by hand: ddprun reads the node count, its node rank, the first host
# (the store), the job id (run id) and a port from Slurm's variables (docs/slurm.md).
#
#   sbatch scripts/examples/sbatch-static.sh [training script args]
#   sbatch -N4 --export=ALL,NPROC_PER_NODE=8,TRAIN=train.py scripts/examples/sbatch-static.sh --epochs 3
#
# Environment (all optional): DDPRUN (default: ddprun on PATH), NPROC_PER_NODE (2; on GPU nodes the GPU count),
# TRAIN (scripts/examples/ddp_train.py, relative to the submit directory), DDPRUN_ARGS (more ddprun flags,
# split on blanks, e.g. "--max_restarts 2 --log_dir logs").
#
# Preemption and time limit: 2 minutes before the limit Slurm sends SIGUSR1 to the job step (--signal); ddprun
# forwards it to the workers (save a checkpoint there), stops them after --shutdown_timeout and exits 75 -
# "interrupted by Slurm, incomplete". The script then requeues the job, which resumes from the checkpoint.
# scancel (SIGTERM) also ends ddprun with 75, but the batch shell gets SIGTERM too and does not requeue; as
# Slurm signals the shell and the step's tasks in no fixed order (srun may return first), the script also asks
# Slurm whether the job still runs: scancel marks it cancelled at once.
#SBATCH --job-name=ddprun-static
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:30:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
set -uo pipefail

: "${DDPRUN:=ddprun}"
: "${NPROC_PER_NODE:=2}"
: "${TRAIN:=scripts/examples/ddp_train.py}"

cancelled=0
trap 'cancelled=1' TERM  # scancel: runs once srun has returned

# shellcheck disable=SC2086  # DDPRUN_ARGS is a list of flags
srun --ntasks-per-node=1 "$DDPRUN" --nproc_per_node="$NPROC_PER_NODE" ${DDPRUN_ARGS:-} "$TRAIN" "$@"
rc=$?
if ((rc == 75 && !cancelled)) && scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -q "JobState=RUNNING"; then
  echo "sbatch-static: ddprun was interrupted by Slurm (exit 75): requeueing job $SLURM_JOB_ID" >&2
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
