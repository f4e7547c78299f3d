#!/usr/bin/env bash
# Store at scale: 1k, 4k and 16k simulated ranks initialising at once (connect, VALIDATE in the 2.x dialect,
# ADD to a counter, WAIT for the barrier key, GET: what init_process_group does with the store) against
# ddprun-store (both dialects), torch 1.13's TCPStore server and torch 2.6's (Debian 13 root, no libuv), in
# one run. See scripts/bench/store_scale_bench.py and scripts/bench/store_init_storm.cc.
#
#   scripts/bench-store-scale.sh [BUILD_DIR]      (default BUILD_DIR: <repo>/build-bench, Release)
#
# Prints Markdown on stdout (progress on stderr); raw results in BUILD_DIR/bench-store-scale.json. The soft
# descriptor limit is raised to the hard one (16k ranks need 16k descriptors in the generator and in the
# server). Environment: BENCH_SCALE_RANKS (1000,4000,16000), BENCH_SCALE_SERVERS
# (ddprun,ddprun-legacy,torch-1.13,torch-2.6; also ddprun-secret: ddprun-store --secret-file; torch-2.6 is left out
# without the root), BENCH_REPEATS (3),
# BENCH_SCALE_TIMEOUT (120 s per run), TORCH_PYTHON (/usr/bin/python3), BENCH_BUILD (1: configure and build
# BUILD_DIR as Release; 0: use it as built).
# Exit codes: 0 done (failed runs show in the table), 1 build failed, a program is missing (BENCH_BUILD=0) or
# the descriptor limit is too low.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build-bench}")
log() { echo "bench-store-scale: $*" >&2; }

if [[ ${BENCH_BUILD:-1} == 1 ]]; then
  log "building in $build (Release)"
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_BENCHMARKS=ON \
    -DDDPRUN_WERROR=OFF >/dev/null
  ninja -C "$build" ddprun-store ddprun-store-init-storm >&2 || { log "build failed"; exit 1; }
fi
ulimit -n "$(ulimit -Hn)"
ranks=${BENCH_SCALE_RANKS:-1000,4000,16000}
largest=$(tr ',' '\n' <<<"$ranks" | sort -n | tail -1)
if (( $(ulimit -n) < largest + 64 )); then
  log "the descriptor limit ($(ulimit -n)) is below $largest ranks + 64: raise the hard limit (ulimit -Hn)"
  exit 1
fi
servers=${BENCH_SCALE_SERVERS:-ddprun,ddprun-legacy,torch-1.13,torch-2.6}
source "$repo/scripts/bench/common.sh"
bench_require "$build/launcher/ddprun-store"
bench_require "$build/scripts/bench/ddprun-store-init-storm"
root_args=()
if servers=$(torch26_configs "$servers"); then
  root_args=(--torch26-root "$repo/scripts/torch26-root.sh")
fi
USE_LIBUV=0 exec "${TORCH_PYTHON:-/usr/bin/python3}" "$repo/scripts/bench/store_scale_bench.py" \
  --store "$build/launcher/ddprun-store" --storm "$build/scripts/bench/ddprun-store-init-storm" \
  --python "${TORCH_PYTHON:-/usr/bin/python3}" "${root_args[@]}" --servers "$servers" --ranks "$ranks" \
  --reps "${BENCH_REPEATS:-3}" --timeout "${BENCH_SCALE_TIMEOUT:-120}" --json "$build/bench-store-scale.json"
