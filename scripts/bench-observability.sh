#!/usr/bin/env bash
# Observability cost: what a job pays for ddprun's status publishing and /metrics, and how fast `ddprun status`
# answers for a 1,000-node job. See scripts/bench/observability_bench.py for the method.
#
#   scripts/bench-observability.sh [BUILD_DIR]      (default BUILD_DIR: <repo>/build, used as built)
#
# BUILD_DIR is a build directory (BUILD_DIR/launcher/ddprun) or a directory holding copies of ddprun and
# ddprun-store (safe from a rebuild while the benchmark runs).
# 1. Agent CPU (% of one core, the agent process alone): a real 2-node × 2-rank DDP job on loopback
#    (scripts/examples/ddp_train.py, static rendezvous, gloo on CPUs) trained for BENCH_TRAIN_S seconds, under
#    ddprun, ddprun --metrics_port with /metrics scraped every second, and torchrun of torch 1.13, alternately.
# 2. Store requests per second per node during the training (ddprun_store_requests_total of the agent that
#    hosts the store, from the scraped /metrics).
# 3. `ddprun status` (--json and the table) of a simulated 1,000-node c10d job in one ddprun-store, while a
#    writer rewrites the agents' documents at 500 sets/s.
# Goals (the issue): < 1 % of a core per agent, ≤ 1 store request/s per node, `status` in ≤ 1 s.
# Prints Markdown on stdout (progress on stderr) with the machine, the torch version and the load average
# (/proc/loadavg) before and after; raw results in BENCH_RESULTS_DIR/bench-observability.json (default /tmp).
# Takes about 6 minutes on 2 CPUs with the defaults: 6 jobs of 50-70 s, then about 30 s of `status`.
# Environment: BENCH_VARIANTS (ddprun,ddprun-metrics,torchrun), BENCH_REPS (2 runs of each; 0 skips parts 1
# and 2), BENCH_TRAIN_S (40), BENCH_STATUS_REPS (10 calls of each form; 0 skips part 3), BENCH_STATUS_NODES
# (1000), BENCH_STATUS_RANKS (8 per node), BENCH_STATUS_WRITE_RATE (500 sets/s), TORCH_PYTHON (a Python with
# torch 1.13, default /usr/bin/python3), BENCH_NICE (nice -n for the measurement), BENCH_BUILD (0: use BUILD_DIR
# as it is, e.g. the shared build, without touching it; 1: configure BUILD_DIR as Release and build ddprun and
# ddprun-store there, so give it a directory of its own).
# Exit codes: 0 done (failed runs show in the tables), 1 build failed, a program is missing or no torch,
# 2 bad arguments.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build}")
python=${TORCH_PYTHON:-/usr/bin/python3}
log() { echo "bench-observability: $*" >&2; }
source "$repo/scripts/bench/common.sh"

: "${BENCH_BUILD:=0}"
bin=$build/launcher
if [[ $BENCH_BUILD == 0 && ! -e $bin/ddprun && -e $build/ddprun ]]; then
  bin=$build  # copies of the two programs
fi
bench_build "$bin/ddprun" "$bin/ddprun-store"
if ! "$python" -c 'import torch.distributed.run' 2>/dev/null; then
  log "$python cannot import torch.distributed.run (set TORCH_PYTHON)"
  exit 1
fi
results_dir=${BENCH_RESULTS_DIR:-/tmp}
mkdir -p "$results_dir"

run_marked "$python" "$repo/scripts/bench/observability_bench.py" --ddprun "$bin/ddprun" \
  --store "$bin/ddprun-store" --train "$repo/scripts/examples/ddp_train.py" --python "$python" \
  --variants "${BENCH_VARIANTS:-ddprun,ddprun-metrics,torchrun}" --reps "${BENCH_REPS:-2}" \
  --train-s "${BENCH_TRAIN_S:-40}" --status-reps "${BENCH_STATUS_REPS:-10}" \
  --nodes "${BENCH_STATUS_NODES:-1000}" --ranks "${BENCH_STATUS_RANKS:-8}" \
  --write-rate "${BENCH_STATUS_WRITE_RATE:-500}" --token "$bench_token" \
  --json "$results_dir/bench-observability.json"
log "raw results: $results_dir/bench-observability.json"
