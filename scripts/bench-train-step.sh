#!/usr/bin/env bash
# Training-step benchmark (issue 6): the C++ example trainer (ddprun-example-train: libtorch + the ddprun
# worker SDK's GradientSynchronizer over the CPU backend) against the same model under Python torch DDP with
# gloo (scripts/bench/ddp_step_bench.py), both launched by ddprun, with 2 and 4 ranks on this machine.
#
#   scripts/bench-train-step.sh [BUILD_DIR]     (default: <repo>/build-bench-train, Release)
#
# Same model (MLP, --layers/--hidden), synthetic data, DistributedSampler shard, SGD with momentum and
# per-rank batch on both sides; a step = zero_grad .. optimizer.step(), batch indexing included, first
# BENCH_WARMUP steps excluded; OMP_NUM_THREADS=1 / --threads 1 per rank on both. Each configuration runs
# BENCH_REPS times alternating C++ and Python; the table reports the median over runs of each run's median
# step time. Prints a Markdown table on stdout (progress on stderr).
#
# Environment: BENCH_RANKS ("2 4"), BENCH_MODELS ("256x3x64 1024x3x4 1024x3x64": hidden x layers x per-rank
# batch; a small batch makes the gradient all-reduce a large share of the step), BENCH_STEPS (40),
# BENCH_WARMUP (5), BENCH_REPS (3), TORCH_PYTHON (/usr/bin/python3), BENCH_NICE (run the jobs under
# `nice -n BENCH_NICE`, e.g. -10 as root on a machine shared with builds; unset: as started).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build-bench-train}
ranks_list=${BENCH_RANKS:-"2 4"}
models=${BENCH_MODELS:-"256x3x64 1024x3x4 1024x3x64"}
steps=${BENCH_STEPS:-40}
warmup=${BENCH_WARMUP:-5}
reps=${BENCH_REPS:-3}
python=${TORCH_PYTHON:-/usr/bin/python3}
launch=()
if [[ -n ${BENCH_NICE:-} ]]; then launch=(nice -n "$BENCH_NICE"); fi

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF >&2
fi
cmake --build "$build" --parallel 2 --target ddprun ddprun-example-train >&2
ddprun=$build/launcher/ddprun
example=$build/worker_sdk/torch/ddprun-example-train

# run_one <cpp|python> <ranks> <hidden> <layers> <batch>: prints "median_ms samples_per_s exposed_ms" from
# rank 0's summary (exposed_ms: C++ only, the all-reduce time backward did not hide; "-" for Python).
run_one() {
  local kind=$1 n=$2 hidden=$3 layers=$4 batch=$5 out
  local common=(--steps "$steps" --warmup "$warmup" --batch-size "$batch" --hidden "$hidden" --layers "$layers"
                --threads 1)
  if [[ $kind == cpp ]]; then
    out=$(timeout 600 "${launch[@]}" "$ddprun" --standalone --nproc_per_node "$n" --no_python "$example" "${common[@]}" \
          --log-every 0 2>&1) || { echo "$out" >&2; return 1; }
  else
    out=$(timeout 600 "${launch[@]}" "$ddprun" --standalone --nproc_per_node "$n" --python "$python" \
          "$repo/scripts/bench/ddp_step_bench.py" "${common[@]}" 2>&1) || { echo "$out" >&2; return 1; }
  fi
  local line
  line=$(grep 'summary: ' <<<"$out" | tail -1)
  [[ -n $line ]] || { echo "$out" >&2; return 1; }
  local ms rate exposed
  ms=$(sed -n 's/.*step_ms_median=\([0-9.]*\).*/\1/p' <<<"$line")
  rate=$(sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p' <<<"$line")
  exposed=$(sed -n 's/.*exposed_sync_ms_median=\([0-9.]*\).*/\1/p' <<<"$line")
  echo "$ms $rate ${exposed:--}"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "| model (hidden x layers, params) | batch/rank | ranks | C++ SDK step (ms) | Python DDP gloo step (ms) | Python ÷ C++ | C++ samples/s | Python samples/s | C++ exposed sync (ms) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for model in $models; do
  IFS=x read -r hidden layers batch <<<"$model"
  params=$(( 32 * hidden + hidden + (layers - 2) * (hidden * hidden + hidden) + hidden + 1 ))
  for n in $ranks_list; do
    cpp_ms=() py_ms=() cpp_rate=() py_rate=() cpp_exp=()
    for ((r = 0; r < reps; ++r)); do
      echo "== $model, $n ranks, run $((r + 1))/$reps" >&2
      read -r ms rate exposed < <(run_one cpp "$n" "$hidden" "$layers" "$batch")
      cpp_ms+=("$ms") cpp_rate+=("$rate") cpp_exp+=("$exposed")
      read -r ms rate exposed < <(run_one python "$n" "$hidden" "$layers" "$batch")
      py_ms+=("$ms") py_rate+=("$rate")
      echo "   C++ ${cpp_ms[-1]} ms, Python ${py_ms[-1]} ms" >&2
    done
    c=$(printf '%s\n' "${cpp_ms[@]}" | median)
    p=$(printf '%s\n' "${py_ms[@]}" | median)
    cr=$(printf '%s\n' "${cpp_rate[@]}" | median)
    pr=$(printf '%s\n' "${py_rate[@]}" | median)
    ce=$(printf '%s\n' "${cpp_exp[@]}" | median)
    printf '| %s x %s (%s) | %s | %s | %.2f | %.2f | %.2fx | %.0f | %.0f | %.2f |\n' "$hidden" "$layers" "$params" \
      "$batch" "$n" "$c" "$p" "$(awk -v a="$p" -v b="$c" 'BEGIN {print (b > 0) ? a / b : 0}')" "$cr" "$pr" "$ce"
  done
done
