#!/usr/bin/env bash
# The worker SDK on libtorch 2.6: configures and builds ddprun, the SDK and the SDK's tests with the project's
# CMake inside the torch 2.6 root (Debian 13: GCC 14, Boost 1.83, spdlog 1.15/fmt 10, CLI11 2.4, Catch2 3,
# libtorch 2.6; scripts/torch26-root.sh), warnings as errors, CUDA and NCCL off; then runs there, with CTest,
# the tests whose subject is libtorch (tests/worker_sdk_torch, label worker_sdk): worker_sdk_torch_tests (the
# sampler against Python torch 2.6), sdk.gradient_check.*, sdk.example_train (under ddprun) and
# sdk.example_train.torchrun (under torch 2.6's own torchrun). The SDK's core (tests/worker_sdk: no torch in
# it) is built and tested on the host only: one proof per torch version where torch is the subject (issue 43,
# docs/testing.md "Which worker").
# CTest sdk.libtorch26 runs this script.
#
#   scripts/check-sdk-torch26.sh               build (only what changed), then test
#   scripts/check-sdk-torch26.sh --build-only  build only (scripts/test.sh does this before its tests, so that
#                                              the build does not starve timing-sensitive tests of CPU)
#
# Build directory: $DDPRUN_TORCH26_BUILD_DIR, default build-torch26 in the repository (never its build/, which
# is the host's): reused, so a rerun rebuilds only what changed, and compiled through the root's ccache with
# the host's cache directory ($DDPRUN_CCACHE_DIR, scripts/test.sh: /var/cache/ddprun/ccache), so a fresh
# clone's first build here is mostly cache hits. Only the targets the tests need are built, at nice 10.
# $DDPRUN_CHECK_JOBS: parallel compile and test jobs (default: nproc). Needs root (the chroot; the first run
# also builds the root).
# Exit status: 0 when everything built and every selected test passed; 1 otherwise (the failing step's
# output is shown).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${DDPRUN_TORCH26_BUILD_DIR:-$repo/build-torch26}
jobs=${DDPRUN_CHECK_JOBS:-$(nproc)}
build_only=0
case ${1:-} in
  "") ;;
  --build-only) build_only=1 ;;
  *)
    echo "check-sdk-torch26: unknown argument '$1' (--build-only)" >&2
    exit 2
    ;;
esac

die() {
  echo "check-sdk-torch26: $*" >&2
  exit 1
}

[[ $build == /* ]] || die "DDPRUN_TORCH26_BUILD_DIR must be an absolute path (got '$build')"
case $build/ in
  "$repo"/build/*) die "$build is the host's build directory; use a directory of its own" ;;
esac
[[ $(id -u) -eq 0 ]] || die "needs root (scripts/torch26-root.sh enters the root with unshare and chroot)"

"$repo/scripts/torch26-root.sh" >/dev/null # builds the root when missing or stale
mkdir -p "$build"
# One check at a time per build directory.
exec 9>"$build.lock"
flock -w 1800 9 || die "another check holds $build.lock (waited 30 minutes)"

# Inside the root, with the build directory as working directory: torch26-root.sh binds it (and /work, /tmp)
# at the same path. The host's PATH may name host-only tools first (pyenv shims): the root's own PATH.
in_root() {
  (cd "$build" && nice -n 10 "$repo/scripts/torch26-root.sh" run \
    env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@")
}

echo "check-sdk-torch26: toolchain in the root:"
in_root sh -c 'g++ --version | head -n1; cmake --version | head -n1;
  python3 -c "import torch; print(\"torch\", torch.__version__)"'

# A build directory configured from another checkout (CI clones afresh) cannot be reused: CMake refuses a
# cache whose source directory differs. Start it over then.
if [[ -f $build/CMakeCache.txt ]] &&
  ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$repo" "$build/CMakeCache.txt"; then
  echo "check-sdk-torch26: $build was configured from another source tree; starting it over"
  find "$build" -mindepth 1 -delete
fi

echo "check-sdk-torch26: configuring $build"
in_root cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPRUN_WERROR=ON \
  -DDDPRUN_WITH_TORCH=ON -DDDPRUN_WITH_CUDA=OFF -DDDPRUN_WITH_NCCL=OFF -DDDPRUN_TORCH26=OFF \
  -DDDPRUN_TORCH_PYTHON=/usr/bin/python3 -DDDPRUN_TORCHRUN=/usr/bin/torchrun >"$build/configure.log" 2>&1 || {
  tail -n 40 "$build/configure.log" >&2
  die "configure failed (log: $build/configure.log)"
}

targets=(ddprun ddprun_sdk ddprun_sdk_torch ddprun-example-train worker_sdk_torch_tests sdk_gradient_check)
echo "check-sdk-torch26: building ${targets[*]} (-j $jobs)"
start=$SECONDS
in_root cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$build/build.log" 2>&1 || {
  grep -E -A 8 'error|FAILED' "$build/build.log" | head -n 80 >&2
  die "build failed (log: $build/build.log)"
}
echo "check-sdk-torch26: built in $((SECONDS - start)) s"
if ((build_only)); then
  exit 0
fi

# The selection must hold the tests this check is about: a renamed test or torchrun missing from the root
# would otherwise pass unnoticed.
tests=$build/tests/worker_sdk_torch
required=(sdk.example_train sdk.example_train.torchrun sdk.gradient_check.ddprun2)
for name in "${required[@]}"; do
  listed=$(in_root ctest --test-dir "$tests" -N -L worker_sdk -R "^${name//./\\.}\$")
  [[ $listed == *"Total Tests: 1"* ]] || die "test $name is not registered with label worker_sdk in $tests"
done
# A Catch2 executable whose tests were not discovered registers <target>_NOT_BUILT, without labels.
listed=$(in_root ctest --test-dir "$tests" -N -R "^worker_sdk_torch_tests_NOT_BUILT")
[[ $listed == *"Total Tests: 0"* ]] || die "the tests of worker_sdk_torch_tests were not discovered in $tests"

echo "check-sdk-torch26: running the worker SDK's libtorch tests (ctest -L worker_sdk in tests/worker_sdk_torch)"
in_root ctest --test-dir "$tests" -L worker_sdk --output-on-failure --no-tests=error -j "$jobs" \
  --timeout 600 || die "worker SDK tests failed with libtorch 2.6 (build: $build)"
echo "check-sdk-torch26: the worker SDK builds and passes its tests with libtorch 2.6"
