#!/usr/bin/env bash
# CPU all-reduce benchmark: the worker SDK's CPU process group (ddprun-allreduce-bench) against torch 1.13's
# gloo backend (bench/gloo_allreduce_bench.py), both launched by ddprun, for 2 and 4 ranks, in one run.
#
#   scripts/bench-allreduce.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build-bench, Release)
#
# Sizes 4 KiB .. 256 MiB (powers of 4), float32 sum; each size runs ~BENCH_MIN_TIME seconds. busbw =
# algbw * 2(n-1)/n (docs/benchmarks.md). The two implementations alternate, BENCH_REPEAT times each, and the
# best run of each size is kept (the machine is shared: the best run is the least disturbed one). cpu_ms is
# the CPU time of all ranks together per all-reduce. Prints `uptime` before and after, then a Markdown
# table; raw JSON lines go to BUILD_DIR/bench-allreduce-results.jsonl.
#
# Environment: BENCH_RANKS (default "2 4"), BENCH_REPEAT (default 2), BENCH_MIN_TIME (default 1),
# BENCH_MAX_BYTES (default 268435456), TORCH_PYTHON (a Python with torch, default /usr/bin/python3).
# Warnings are not errors in this build (GCC 12 at -O3 warns falsely in code the benchmark does not
# measure). Exit codes: 0 done, 1 build failed or a benchmark run failed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build-bench}
read -r -a rank_counts <<<"${BENCH_RANKS:-2 4}"
repeat=${BENCH_REPEAT:-2}
min_time=${BENCH_MIN_TIME:-1}
max_bytes=${BENCH_MAX_BYTES:-268435456}
python=${TORCH_PYTHON:-/usr/bin/python3}

log() { echo "bench-allreduce: $*" >&2; }

log "building in $build (Release)"
mkdir -p "$build"
if ! { cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF \
  -DDDPRUN_BUILD_BENCHMARKS=ON -DDDPRUN_WERROR=OFF &&
  ninja -C "$build" -j2 ddprun ddprun-allreduce-bench; } >"$build/bench-allreduce-build.log" 2>&1; then
  cat "$build/bench-allreduce-build.log" >&2
  log "build failed"
  exit 1
fi
ddprun=$build/launcher/ddprun
bench=$build/scripts/bench/ddprun-allreduce-bench
results=$build/bench-allreduce-results.jsonl
: >"$results"

load_before=$(uptime)
common=(--min-time "$min_time" --max-bytes "$max_bytes")
for n in "${rank_counts[@]}"; do
  for ((r = 1; r <= repeat; r++)); do
    log "$n ranks, run $r/$repeat: ddprun"
    "$ddprun" --standalone --nproc_per_node "$n" --no_python "$bench" "${common[@]}" \
      2>"$build/bench-allreduce-ddprun.err" | grep '^{' >>"$results" ||
      { cat "$build/bench-allreduce-ddprun.err" >&2; log "ddprun-allreduce-bench failed"; exit 1; }
    log "$n ranks, run $r/$repeat: gloo"
    "$ddprun" --standalone --nproc_per_node "$n" --no_python "$python" "$repo/scripts/bench/gloo_allreduce_bench.py" \
      "${common[@]}" 2>"$build/bench-allreduce-gloo.err" | grep '^{' >>"$results" ||
      { cat "$build/bench-allreduce-gloo.err" >&2; log "gloo_allreduce_bench.py failed"; exit 1; }
  done
done
load_after=$(uptime)

echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "Load before: ${load_before#*load average: }; after: ${load_after#*load average: } (uptime)"
echo
"$python" - "$results" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    key = (j["ranks"], j["bytes"], j["impl"])
    if key not in best or j["busbw_GBps"] > best[key]["busbw_GBps"]:
        best[key] = j
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
transport = {j["ranks"]: j["transport"] for (_, _, impl), j in best.items() if impl == "ddprun"}
print("| ranks | size | ddprun busbw GB/s | gloo busbw GB/s | ratio | ddprun cpu ms/op | gloo cpu ms/op |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for (n, b) in sorted({(k[0], k[1]) for k in best}):
    d, g = best.get((n, b, "ddprun")), best.get((n, b, "gloo"))
    if not d or not g:
        continue
    print(f"| {n} | {size(b)} | {d['busbw_GBps']:.3f} | {g['busbw_GBps']:.3f} | "
          f"{d['busbw_GBps'] / g['busbw_GBps']:.2f}x | {d['cpu_ms']:.2f} | {g['cpu_ms']:.2f} |")
print()
print("ddprun transports: " + ", ".join(f"{n} ranks: {t}" for n, t in sorted(transport.items())))
PY
