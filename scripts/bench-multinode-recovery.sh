#!/usr/bin/env bash
# Multi-node recovery benchmark: a real gloo DDP job on 3 network-namespace hosts (scripts/test-cluster.sh) x 2
# ranks, c10d rendezvous with the default timeouts. A worker crash (--nnodes 3 and 2:3; ddprun with and without
# --prestart, torch 1.13 and 2.6 workers; torchrun 2.6) and a 4th host waiting as a spare while host 2's agent
# is SIGKILLed (ddprun --prestart; torchrun 2.6): from the crash (or the kill) to all 6 ranks' first completed
# step after it. Side by side in one run, interleaved; see scripts/bench/multinode_recovery_bench.py.
#
#   scripts/bench-multinode-recovery.sh [BUILD_DIR]   (default BUILD_DIR: <repo>/build-bench-launcher, Release)
#
# Prints Markdown on stdout (progress on stderr) with the machine and its load before and after. Needs root
# (network namespaces; the hosts are brought up here and taken down at the end). Environment:
# BENCH_MULTINODE_CONFIGS (comma-separated names; default all, the 2.6 ones left out when the torch 2.6 root is
# not built), BENCH_MULTINODE_REPS (3), BENCH_MULTINODE_TIMEOUT (90 s per run: a run that has not recovered by
# then counts as not recovered), BENCH_MULTINODE_SPARE_SETTLE (5 s: how long the spare waits before the kill; its
# --prestart standbys import torch meanwhile), TORCH_PYTHON (/usr/bin/python3), BENCH_BUILD (1: configure and build BUILD_DIR
# as Release; 0: use BUILD_DIR as it is). Takes about 15 minutes on 2 quiet CPUs with the defaults.
# Exit codes: 0 done (runs that did not recover show in the table), 1 build failed, no root or no hosts.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build-bench-launcher}")
python=${TORCH_PYTHON:-/usr/bin/python3}

log() { echo "bench-multinode-recovery: $*" >&2; }
source "$repo/scripts/bench/common.sh"

if [[ $(id -u) -ne 0 ]]; then
  log "needs root (network namespaces)"
  exit 1
fi
bench_build "$build/launcher/ddprun"
torch26_args=()
if [[ -x $repo/scripts/torch26-root.sh ]] && "$repo/scripts/torch26-root.sh" path >/dev/null 2>&1; then
  torch26_args=(--torch26-root "$repo/scripts/torch26-root.sh" --torch26-python "$repo/scripts/torch26-python")
else
  log "the torch 2.6 root is not built (scripts/torch26-root.sh): torch 2.6 configurations left out"
fi
bash "$repo/scripts/test-cluster.sh" down >/dev/null 2>&1 || true
bash "$repo/scripts/test-cluster.sh" up 4 >&2 || {
  log "cannot bring up the test hosts (scripts/test-cluster.sh up 4)"
  exit 1
}
take_down() { bash "$repo/scripts/test-cluster.sh" down >/dev/null 2>&1 || true; }
at_exit take_down

configs=()
if [[ -n ${BENCH_MULTINODE_CONFIGS:-} ]]; then configs=(--configs "$BENCH_MULTINODE_CONFIGS"); fi
"$python" "$repo/scripts/bench/multinode_recovery_bench.py" --ddprun "$build/launcher/ddprun" \
  --train "$repo/scripts/examples/ddp_train.py" --cluster "$repo/scripts/test-cluster.sh" --python "$python" \
  "${torch26_args[@]}" "${configs[@]}" --reps "${BENCH_MULTINODE_REPS:-3}" \
  --timeout "${BENCH_MULTINODE_TIMEOUT:-90}" --spare-settle "${BENCH_MULTINODE_SPARE_SETTLE:-5}"
