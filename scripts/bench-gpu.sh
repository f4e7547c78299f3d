#!/usr/bin/env bash
# GPU benchmarks and checks of the worker SDK (issue 6), for a machine with CUDA, NCCL and a CUDA build of
# torch (e.g. the device tool's H200 with torch 2.11+cu130). Builds ddprun against that torch's libtorch and
# the NCCL under /usr/local/cuda, then, with G = the number of visible GPUs:
#   1. the NCCL tests (nccl_tests, the CUDA case of worker_sdk_torch_tests);
#   2. SDK all-reduce vs raw ncclAllReduce (ddprun-nccl-allreduce-bench): G ranks, one per GPU; with a single
#      GPU, 2 ranks on it via NCCL_HOSTID (--distinct-hosts; sockets over loopback, so bandwidth is not
#      representative, the overhead ratio is) and 1 rank;
#   3. the example trainer on the GPU(s) against the same model under Python torch DDP (nccl), step times.
#
#   scripts/bench-gpu.sh [BUILD_DIR]      (default <repo>/build-gpu; results in BUILD_DIR/bench-gpu.txt)
#
# Environment: TORCH_PYTHON (python3; must import a CUDA torch), BENCH_STEPS (100), BENCH_MODEL
# ("4096x4x256": hidden x layers x per-rank batch), DDPRUN_DEPS_PREFIX (a prefix holding the build's
# dependencies where the machine has no Debian packages: scripts/gpu-deps-bundle.sh, scripts/gpu-checks.sh).
# BENCH_PARTS ("tests,allreduce,train": which of the three run after the build).
# NCCL: /usr/local/cuda's when it has one, else the one pip's torch brings (nvidia-nccl-cu*). Exit 0 when every
# step worked, else 1 (every step runs).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build-gpu}
python=${TORCH_PYTHON:-python3}
steps=${BENCH_STEPS:-100}
IFS=x read -r hidden layers batch <<<"${BENCH_MODEL:-4096x4x256}"
mkdir -p "$build"
results=$build/bench-gpu.txt
: >"$results"
log() { echo "bench-gpu: $*" | tee -a "$results" >&2; }

gpus=$( (nvidia-smi -L 2>/dev/null || true) | wc -l)
[[ $gpus -ge 1 ]] || { log "no GPU visible (nvidia-smi -L lists none)"; exit 1; }
torch_prefix=$("$python" -c 'import torch, torch.utils; assert torch.cuda.is_available(); print(torch.utils.cmake_prefix_path)') ||
  { log "$python cannot import a CUDA build of torch"; exit 1; }
log "$gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); torch $("$python" -c 'import torch; print(torch.__version__)')"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
prefixes=$torch_prefix
extra=()
if [[ -n ${DDPRUN_DEPS_PREFIX:-} ]]; then
  prefixes+=";$DDPRUN_DEPS_PREFIX"
  extra+=(-DOPENSSL_ROOT_DIR="$DDPRUN_DEPS_PREFIX")
fi
if [[ ! -e /usr/local/cuda/include/nccl.h ]]; then
  nccl=$("$python" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) || nccl=""
  nccl_lib=$(ls "$nccl"/lib/libnccl.so* 2>/dev/null | head -1) || true
  [[ -n $nccl && -e $nccl/include/nccl.h && -n $nccl_lib ]] ||
    { log "no NCCL: neither /usr/local/cuda nor $python's nvidia.nccl package has nccl.h and libnccl"; exit 1; }
  extra+=(-DDDPRUN_NCCL_INCLUDE="$nccl/include" -DDDPRUN_NCCL_LIBRARY="$nccl_lib")
  log "NCCL from $nccl"
fi
cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDDPRUN_WERROR=OFF \
  -DDDPRUN_BUILD_BENCHMARKS=ON -DCMAKE_PREFIX_PATH="$prefixes" "${extra[@]}" \
  -DDDPRUN_WITH_TORCH=ON -DDDPRUN_WITH_CUDA=ON -DDDPRUN_WITH_NCCL=ON \
  -DDDPRUN_TORCH_PYTHON="$(command -v "$python")" >"$build/configure.log" 2>&1 ||
  { tail -30 "$build/configure.log" >&2; log "configure failed ($build/configure.log)"; exit 1; }
build_start=$(date +%s)
cmake --build "$build" -j "$(nproc)" --target ddprun ddprun-example-train ddprun-nccl-allreduce-bench \
  nccl_tests worker_sdk_torch_tests >"$build/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "error" "$build/build.log" >&2; log "build failed ($build/build.log)"; exit 1; }
log "built in $(($(date +%s) - build_start)) s on $(nproc) CPUs"
ddprun=$build/launcher/ddprun

status=0  # a failing step is noted and the next one runs
parts=,${BENCH_PARTS:-tests,allreduce,train},
if [[ $parts == *,tests,* ]]; then
log "== 1. NCCL tests"
"$build/tests/worker_sdk_torch/nccl_tests" 2>&1 | tee -a "$results" || status=1
"$build/tests/worker_sdk_torch/worker_sdk_torch_tests" "[gpu]" 2>&1 | tee -a "$results" || status=1

fi

if [[ $parts == *,allreduce,* ]]; then
log "== 2. SDK all-reduce vs raw ncclAllReduce (JSON per size; overhead_pct = sdk / raw_sync - 1)"
bench=$build/scripts/bench/ddprun-nccl-allreduce-bench
if [[ $gpus -ge 2 ]]; then
  "$ddprun" --standalone --nproc_per_node "$gpus" --no_python "$bench" 2>>"$results" | tee -a "$results" || status=1
else
  "$ddprun" --standalone --nproc_per_node 2 --no_python "$bench" --distinct-hosts --max-bytes 268435456 \
    2>>"$results" | tee -a "$results" || status=1
fi
"$ddprun" --standalone --nproc_per_node 1 --no_python "$bench" 2>>"$results" | tee -a "$results" || status=1

fi

if [[ $parts == *,train,* ]]; then
log "== 3. training step on the GPU: C++ example (SDK, NCCL) vs Python torch DDP (nccl), $steps steps"
n=$gpus
common=(--steps "$steps" --warmup 10 --hidden "$hidden" --layers "$layers" --batch-size "$batch" --device cuda)
"$ddprun" --standalone --nproc_per_node "$n" --no_python "$build/worker_sdk/torch/ddprun-example-train" \
  "${common[@]}" --log-every 0 2>&1 | grep -E 'summary:|training:|error' | tee -a "$results" || status=1
"$ddprun" --standalone --nproc_per_node "$n" --python "$python" "$repo/scripts/bench/ddp_step_bench.py" \
  "${common[@]}" 2>&1 | grep -E 'summary:|Error' | tee -a "$results" || status=1
fi
log "done: $results (status $status)"
exit "$status"
