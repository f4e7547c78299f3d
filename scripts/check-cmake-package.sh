#!/usr/bin/env bash
# Checks ddprun's CMake package: installs the worker SDK (component "sdk") from a build directory into a
# temporary prefix, then configures, builds and runs a tiny consumer project that only does
#     find_package(ddprun REQUIRED)  +  target_link_libraries(app PRIVATE ddprun::sdk)
# with CMAKE_PREFIX_PATH pointing at the prefix. The consumer uses init(), GradientSynchronizer,
# DistributedSampler and the tensor collectives when the SDK was built with libtorch (init() only otherwise),
# runs once as a plain process, and — when the build has the ddprun launcher — under
# `ddprun --standalone --nproc_per_node 2`.
#
#   scripts/check-cmake-package.sh [BUILD_DIR]     (default: <repo>/build; configured if missing)
#
# Exit 0 when everything worked; the temporary prefix and consumer build are removed on exit.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
jobs=${JOBS:-2}

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$repo" -B "$build" -G Ninja
fi
targets=(ddprun_sdk ddprun_store ddprun_util)
with_torch=0
if grep -q '^DDPRUN_WITH_TORCH:' "$build/CMakeCache.txt" && [[ -f $build/ddprunConfig.cmake ]] &&
   grep -q 'set(ddprun_WITH_TORCH ON)' "$build/ddprunConfig.cmake"; then
  targets+=(ddprun_sdk_torch)
  with_torch=1
fi
have_launcher=0
build_targets=$(cmake --build "$build" --target help 2>/dev/null || true)
if grep -q '^ddprun: ' <<<"$build_targets"; then
  targets+=(ddprun)
  have_launcher=1
fi
echo "== building ${targets[*]} in $build" >&2
cmake --build "$build" --parallel "$jobs" --target "${targets[@]}"

# The consumers compile through the build's ccache launcher when it has one (CMakeLists.txt): their paths are
# the same relative to their build directories every run, so a rerun hits the cache.
consumer_cmake=(-G Ninja)
if [[ -x $build/ddprun-ccache ]]; then
  consumer_cmake+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$build/ddprun-ccache")
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "== installing into $tmp/prefix" >&2
cmake --install "$build" --component sdk --prefix "$tmp/prefix" >/dev/null

mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(ddprun_consumer LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(ddprun 0.1 REQUIRED)
add_executable(app main.cc)
target_link_libraries(app PRIVATE ddprun::sdk)
if(ddprun_WITH_TORCH)
  target_compile_definitions(app PRIVATE WITH_TORCH=1)
endif()
CMAKE
cat >"$tmp/consumer/main.cc" <<'CXX'
#include <cstdio>
#include <string>

// Every public header compiles on its own (no header that is not installed).
#include "ddprun/backends.h"
#include "ddprun/context.h"
#include "ddprun/process_group.h"
#include "ddprun/progress.h"
#include "ddprun/rdzv/store.h"
#include "ddprun/rdzv/store_error.h"
#ifdef WITH_TORCH
#include <torch/torch.h>

#include "ddprun/distributed_sampler.h"
#include "ddprun/gradient_sync.h"
#include "ddprun/tensor_ops.h"
#endif

int main() {
  auto ctx = ddprun::sdk::init();
#ifdef WITH_TORCH
  torch::nn::Linear model(4, 1);
  ddprun::sdk::GradientSynchronizer sync(*model, ctx->process_group());
  ddprun::sdk::DistributedSampler sampler(10, ctx->world_size(), ctx->rank());
  auto idx = sampler.indices();
  auto x = torch::ones({static_cast<int64_t>(idx.size()), 4});
  model->forward(x).sum().backward();
  auto g = model->weight.grad().clone();
  ddprun::sdk::all_reduce(ctx->process_group(), g, ddprun::sdk::ReduceOp::kAvg);
  if (!torch::equal(g, model->weight.grad())) return 1;  // already averaged by backward
#endif
  if (ddprun::rdzv::Store* store = ctx->store()) {  // the job's store, through the installed interface
    store->set("consumer/rank_" + std::to_string(ctx->rank()), "here");
    if (store->add("consumer/count", 1) < 1) return 1;
  }
  ctx->barrier();
  std::printf("consumer ok: rank %d of %d\n", ctx->rank(), ctx->world_size());
  return 0;
}
CXX

echo "== configuring and building the consumer (find_package(ddprun), CMAKE_PREFIX_PATH=$tmp/prefix)" >&2
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" "${consumer_cmake[@]}" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer/build" --parallel "$jobs"

echo "== running the consumer" >&2
"$tmp/consumer/build/app"
if [[ $have_launcher == 1 ]]; then
  timeout 180 "$build/launcher/ddprun" --standalone --nproc_per_node 2 --no_python "$tmp/consumer/build/app" \
    2>&1 | grep -E 'consumer ok|error' >&2
  [[ ${PIPESTATUS[0]} == 0 ]]
fi

if [[ $with_torch == 1 ]]; then
  # The complete minimal example of docs/worker-sdk.md, kept as worker_sdk/examples/minimal: the files must
  # be the ones the page shows, and must build against the installed package and train.
  minimal=$repo/worker_sdk/examples/minimal
  doc=$repo/docs/worker-sdk.md
  block() { awk -v lang="$1" '$0 == "```" lang {on=1; next} on && $0 == "```" {exit} on {print}' "$doc"; }
  diff <(block cmake) "$minimal/CMakeLists.txt" >&2 ||
    { echo "docs/worker-sdk.md's CMakeLists.txt differs from $minimal/CMakeLists.txt" >&2; exit 1; }
  diff <(block cpp) "$minimal/main.cc" >&2 ||
    { echo "docs/worker-sdk.md's main.cc differs from $minimal/main.cc" >&2; exit 1; }
  echo "== building the documented minimal example ($minimal)" >&2
  cmake -S "$minimal" -B "$tmp/minimal" "${consumer_cmake[@]}" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
  cmake --build "$tmp/minimal" --parallel "$jobs"
  "$tmp/minimal/train" | tee "$tmp/minimal.out" >&2
  grep -q 'epoch 2 done' "$tmp/minimal.out"
  if [[ $have_launcher == 1 ]]; then
    timeout 180 "$build/launcher/ddprun" --standalone --nproc_per_node 2 --no_python "$tmp/minimal/train" \
      >"$tmp/minimal-ddprun.out" 2>&1 || { cat "$tmp/minimal-ddprun.out" >&2; exit 1; }
    grep -q 'epoch 2 done' "$tmp/minimal-ddprun.out"
  fi
fi
echo "cmake package OK (libtorch layer: $with_torch)" >&2
