#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang and runs each one under `ctest -L fuzz`.
#   scripts/fuzz.sh [build-dir]                 default: build-fuzz next to this repository's sources
#   DDPRUN_FUZZ_SECONDS=600 scripts/fuzz.sh     how long each target fuzzes (default 60)
# Needs clang++ with libFuzzer (Debian: clang libclang-rt-dev); not libtorch, not CUDA. Exit status is
# ctest's: non-zero when a target crashed; the crashing input is then in <build>/tests/fuzz/<target>-crash-*
# (replay it with `<build>/tests/fuzz/<target> <file>`).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build-fuzz}
seconds=${DDPRUN_FUZZ_SECONDS:-60}
cxx=${DDPRUN_FUZZ_CXX:-clang++}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found; install clang and libclang-rt-dev (or set DDPRUN_FUZZ_CXX)" >&2
  exit 2
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cc"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" 2>"$probe/err"; then
  echo "fuzz.sh: $cxx cannot link libFuzzer programs (install libclang-rt-dev):" >&2
  cat "$probe/err" >&2
  exit 2
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDDPRUN_FUZZ=ON -DDDPRUN_BUILD_TESTS=OFF -DDDPRUN_WITH_TORCH=OFF -DDDPRUN_WITH_CUDA=OFF \
  -DDDPRUN_FUZZ_SECONDS="$seconds"
cmake --build "$build" --target fuzz_wire_codec fuzz_store_session -j "${DDPRUN_JOBS:-$(nproc)}"
ctest --test-dir "$build/tests/fuzz" -L fuzz --output-on-failure -j 2
