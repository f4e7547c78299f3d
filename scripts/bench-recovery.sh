#!/usr/bin/env bash
# End-to-end recovery benchmark: a real 2-rank DDP job (scripts/examples/ddp_train.py, gloo on CPUs) whose
# rank 1 crashes mid-training; measured from the crash to every rank's first completed step of the restarted
# attempt, under ddprun with torch 1.13 workers, ddprun with torch 2.6 workers, torchrun 1.13 (defaults and
# --monitor_interval 0.1) and torchrun 2.6 (defaults, and with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), in one
# run. Torch 2.6 is the Debian 13 root of scripts/torch26-root.sh (scripts/torch26-python for ddprun's
# workers, `torch26-root.sh run /usr/bin/torchrun` for torchrun 2.6). Also counts how many of the restarts of
# torchrun 2.6 (defaults: one store shared across attempts, pytorch#135712) and of ddprun with torch 2.6
# workers recover at all. See scripts/bench/recovery_bench.py for the method.
#
#   scripts/bench-recovery.sh [BUILD_DIR]      (default BUILD_DIR: <repo>/build-bench-launcher, Release)
#
# Prints Markdown on stdout (progress on stderr), with the load average (/proc/loadavg, as `uptime` shows it)
# before and after and the 1-minute load at the start of each run; the raw results go to
# BENCH_RESULTS_DIR/bench-recovery.json (default BUILD_DIR). Takes about 10 minutes on 2 quiet CPUs with
# the defaults; a torchrun 2.6 restart that hangs costs the time limit. No run is started that would likely
# end later than BENCH_DEADLINE_S (default 1500) seconds after the script started.
#
# Environment: BENCH_RECOVERY_CONFIGS (all eight: ddprun-1.13,ddprun-1.13-prestart,ddprun-2.6,
# ddprun-2.6-prestart,torchrun-1.13,torchrun-1.13-0.1,torchrun-2.6,torchrun-2.6-noshare; the 2.6 ones are left
# out when the root is not built),
# BENCH_RECOVERY_REPS (5 runs per configuration), BENCH_RECOVERY_COUNT_REPS (10 runs of ddprun-2.6 and
# torchrun-2.6, for the recovery count), BENCH_RECOVERY_TIMEOUT (60 s per run), BENCH_DEADLINE_S (1500),
# TORCH_PYTHON (a Python with torch 1.13, default /usr/bin/python3), BENCH_NICE (nice -n for the
# measurement), BENCH_BUILD (1: configure and build BUILD_DIR as Release; 0: use BUILD_DIR as it is, e.g. the
# shared RelWithDebInfo build, without touching it).
# Exit codes: 0 done (failed runs show in the table), 1 build failed or no torch.
set -euo pipefail
start=$(date +%s)

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build-bench-launcher}")
python=${TORCH_PYTHON:-/usr/bin/python3}

log() { echo "bench-recovery: $*" >&2; }
source "$repo/scripts/bench/common.sh"

bench_build "$build/launcher/ddprun"
if ! "$python" -c 'import torch.distributed.run' 2>/dev/null; then
  log "$python cannot import torch.distributed.run (set TORCH_PYTHON)"
  exit 1
fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
configs=${BENCH_RECOVERY_CONFIGS:-ddprun-1.13,ddprun-1.13-prestart,ddprun-2.6,ddprun-2.6-prestart,torchrun-1.13,torchrun-1.13-0.1,torchrun-2.6,torchrun-2.6-noshare}
with_torch26 "$configs"
results_dir=${BENCH_RESULTS_DIR:-$build}
mkdir -p "$results_dir"

# The helper and everything it starts carry the token of scripts/bench/common.sh: killed on any exit.
run_marked "$python" "$repo/scripts/bench/recovery_bench.py" \
  --ddprun "$build/launcher/ddprun" --train "$repo/scripts/examples/ddp_train.py" --python "$python" \
  "${torch26_args[@]}" --configs "$configs" --build-type "${build_type:-?}" \
  --reps "${BENCH_RECOVERY_REPS:-5}" --count-reps "${BENCH_RECOVERY_COUNT_REPS:-10}" \
  --timeout "${BENCH_RECOVERY_TIMEOUT:-60}" --stop-at "$((start + ${BENCH_DEADLINE_S:-1500}))" \
  --token "$bench_token" --json "$results_dir/bench-recovery.json"
log "raw results: $results_dir/bench-recovery.json"
