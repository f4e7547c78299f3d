#!/bin/bash
# Elastic DDP training with ddprun under Slurm (c10d rendezvous): the job keeps going when a node fails or
# its workers crash - the surviving nodes re-form the group (down to MIN_NODES) and the workers restart from
# their last checkpoint, up to MAX_RESTARTS times. --slurm is needed because --nnodes is given (a range);
# ddprun still takes the endpoint (first host, port from the job id), run id and is_host from Slurm.
#
#   sbatch scripts/examples/sbatch-elastic.sh [training script args]
#   sbatch -N8 --export=ALL,MIN_NODES=6,NPROC_PER_NODE=8 scripts/examples/sbatch-elastic.sh --epochs 3
#
# Environment (all optional): DDPRUN (ddprun on PATH), NPROC_PER_NODE (2), MIN_NODES (1), MAX_RESTARTS (3),
# TRAIN (scripts/examples/ddp_train.py), CHECKPOINT (checkpoint.pt in the submit directory; the training
# script must resume from it), RDZV_BACKEND (c10d; etcd or etcd-v2 with RDZV_ENDPOINT = the etcd members,
# "e1:2379,e2:2379,e3:2379": the rendezvous then lives in etcd instead of the first node's agent),
# DDPRUN_ARGS (more ddprun flags, split on blanks).
#
# --no-kill keeps the allocation when a node fails, --kill-on-bad-exit=0 keeps the other ddprun agents
# running when one exits with an error: both let ddprun handle failures itself.
#SBATCH --job-name=ddprun-elastic
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:30:00
#SBATCH --no-kill
set -uo pipefail

: "${DDPRUN:=ddprun}"
: "${NPROC_PER_NODE:=2}"
: "${MIN_NODES:=1}"
: "${MAX_RESTARTS:=3}"
: "${TRAIN:=scripts/examples/ddp_train.py}"
: "${CHECKPOINT:=$PWD/checkpoint.pt}"

# shellcheck disable=SC2086  # DDPRUN_ARGS is a list of flags
srun --ntasks-per-node=1 --kill-on-bad-exit=0 "$DDPRUN" --slurm --rdzv_backend="${RDZV_BACKEND:-c10d}" \
  ${RDZV_ENDPOINT:+--rdzv_endpoint="$RDZV_ENDPOINT"} \
  --nnodes="$MIN_NODES:$SLURM_JOB_NUM_NODES" --nproc_per_node="$NPROC_PER_NODE" \
  --max_restarts="$MAX_RESTARTS" ${DDPRUN_ARGS:-} "$TRAIN" --checkpoint "$CHECKPOINT" "$@"
