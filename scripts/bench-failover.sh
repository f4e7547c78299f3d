#!/usr/bin/env bash
# Store-host failover benchmark: 3 network-namespace hosts (scripts/test-cluster.sh) x 2 gloo DDP workers,
# c10d rendezvous hosted by host 1, which is SIGKILLed mid-training; measured from the kill to the survivors'
# workers running and training again, under ddprun (torch 1.13 and 2.6 workers) and torchrun 1.13 and 2.6, in
# one run. See scripts/bench/failover_bench.py.
#
#   scripts/bench-failover.sh [BUILD_DIR]      (default BUILD_DIR: <repo>/build, already built; needs root)
#
# Prints Markdown on stdout (progress on stderr); raw results in BENCH_RESULTS_DIR/bench-failover.json
# (default BUILD_DIR). Takes about 4 x BENCH_FAILOVER_REPS x 40 s.
# Environment: BENCH_FAILOVER_CONFIGS (ddprun-1.13,ddprun-2.6,torchrun-1.13,torchrun-2.6; the 2.6 ones are left
# out when the torch 2.6 root is not built), BENCH_FAILOVER_REPS (3), BENCH_FAILOVER_CAP (seconds to wait after
# the kill, 90), TORCH_PYTHON (a Python with torch 1.13, /usr/bin/python3).
# Exit codes: 0 done, 1 no ddprun in BUILD_DIR, no torch, not root, or the hosts cannot be made.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build}")
python=${TORCH_PYTHON:-/usr/bin/python3}
log() { echo "bench-failover: $*" >&2; }

[[ -x $build/launcher/ddprun ]] || { log "missing $build/launcher/ddprun: build the tree first"; exit 1; }
[[ $(id -u) -eq 0 ]] || { log "needs root (network namespaces)"; exit 1; }
"$python" -c 'import torch.distributed.run' 2>/dev/null || { log "$python has no torch (set TORCH_PYTHON)"; exit 1; }
configs=${BENCH_FAILOVER_CONFIGS:-ddprun-1.13,ddprun-2.6,torchrun-1.13,torchrun-2.6}
source "$repo/scripts/bench/common.sh"
with_torch26 "$configs"
results_dir=${BENCH_RESULTS_DIR:-$build}
mkdir -p "$results_dir"

exec "$python" "$repo/scripts/bench/failover_bench.py" --ddprun "$build/launcher/ddprun" \
  --train "$repo/scripts/examples/ddp_train.py" --cluster "$repo/scripts/test-cluster.sh" --python "$python" \
  "${torch26_args[@]}" --configs "$configs" --reps "${BENCH_FAILOVER_REPS:-3}" --cap "${BENCH_FAILOVER_CAP:-90}" \
  --json "$results_dir/bench-failover.json"
