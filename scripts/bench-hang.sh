#!/usr/bin/env bash
# Hang benchmark: a real 3-rank DDP job (scripts/examples/ddp_train.py, gloo on CPUs, gloo's timeout at torch's
# default of 30 minutes) whose rank 2 stops for good at step 10, outside any collective; measured from the
# moment it stops to the launcher's exit, under ddprun --hang_timeout 15 with torch 1.13 and torch 2.6 workers
# and under torchrun 1.13 and 2.6, in one run; then (BENCH_HANG_FP_S > 0) a normal job under
# --hang_timeout 30 for that long, which must never be taken for hung. See scripts/bench/hang_bench.py.
#
#   scripts/bench-hang.sh [BUILD_DIR]      (default BUILD_DIR: <repo>/build, already built)
#
# Prints Markdown on stdout (progress on stderr); raw results in BENCH_RESULTS_DIR/bench-hang.json (default
# BUILD_DIR). Takes about 3 × (4 × 30 s + 2 × cap) with the defaults, plus BENCH_HANG_FP_S.
# Environment: BENCH_HANG_CONFIGS (ddprun-1.13,ddprun-2.6,torchrun-1.13,torchrun-2.6; the 2.6 ones are left
# out when the torch 2.6 root is not built), BENCH_HANG_REPS (3), BENCH_HANG_TIMEOUT (ddprun's --hang_timeout,
# 15), BENCH_HANG_CAP (seconds a launcher may keep waiting after the hang, 120), BENCH_HANG_FP_S (0: no
# false-positive run; the issue's check is 600), TORCH_PYTHON (a Python with torch 1.13, /usr/bin/python3).
# Exit codes: 0 done, 1 no ddprun in BUILD_DIR or no torch, 2 bad arguments.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build}")
python=${TORCH_PYTHON:-/usr/bin/python3}
log() { echo "bench-hang: $*" >&2; }

[[ -x $build/launcher/ddprun ]] || { log "missing $build/launcher/ddprun: build the tree first"; exit 1; }
"$python" -c 'import torch.distributed.run' 2>/dev/null || { log "$python has no torch (set TORCH_PYTHON)"; exit 1; }
configs=${BENCH_HANG_CONFIGS:-ddprun-1.13,ddprun-2.6,torchrun-1.13,torchrun-2.6}
source "$repo/scripts/bench/common.sh"
with_torch26 "$configs"
results_dir=${BENCH_RESULTS_DIR:-$build}
mkdir -p "$results_dir"

exec "$python" "$repo/scripts/bench/hang_bench.py" --ddprun "$build/launcher/ddprun" \
  --train "$repo/scripts/examples/ddp_train.py" --python "$python" "${torch26_args[@]}" --configs "$configs" \
  --reps "${BENCH_HANG_REPS:-3}" --hang-timeout "${BENCH_HANG_TIMEOUT:-15}" --cap "${BENCH_HANG_CAP:-120}" \
  --false-positive-s "${BENCH_HANG_FP_S:-0}" --json "$results_dir/bench-hang.json"
