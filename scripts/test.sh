#!/usr/bin/env bash
# Installs the dependencies, builds ddprun and runs its whole test suite. The README's test command.
#   scripts/test.sh                 everything (unit, integration, interop, fuzz smoke)
#   CTEST_ARGS="-L unit" scripts/test.sh    a subset (any ctest arguments)
#   DDPRUN_SKIP_FUZZ=1 scripts/test.sh      skip the clang/libFuzzer build
# Every suite this machine can run must run: the torch 2.6 root is built (or reused) here, Slurm is
# installed, and DDPRUN_REQUIRE_ALL_SUITES=1 turns a suite's would-be skip into a failure. Only what the
# machine cannot do (a GPU) skips, visibly.
set -euo pipefail
cd "$(dirname "$0")/.."

DDPRUN_DEPS_SLURM=1 scripts/install-deps.sh
scripts/torch26-root.sh
export DDPRUN_REQUIRE_ALL_SUITES=${DDPRUN_REQUIRE_ALL_SUITES:-1}

build=${DDPRUN_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPRUN_TORCH26=ON
cmake --build "$build" -j "$(nproc)"

# shellcheck disable=SC2086
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 600 ${CTEST_ARGS:-}

if [[ "${DDPRUN_SKIP_FUZZ:-0}" != 1 && -x scripts/fuzz.sh ]]; then
  scripts/fuzz.sh
fi
