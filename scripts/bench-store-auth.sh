#!/usr/bin/env bash
# The cost of a job's secret (--rdzv_secret_file, docs/security.md), in one run:
#   1. scripts/bench/store_auth_bench.py: an agent's connection (connect, VALIDATE, PING) to ddprun-store without
#      a secret, beside the same plus the AUTH handshake to ddprun-store --secret-file (BENCH_AUTH_CONNECTIONS,
#      500 each, alternating);
#   2. scripts/bench-store-scale.sh with the servers ddprun and ddprun-secret: N worker clients initialising at
#      once (BENCH_SCALE_RANKS, default 16000), admitted by address, every request checked for the job's keys.
#
#   scripts/bench-store-auth.sh [BUILD_DIR]   (default <repo>/build; BUILD_DIR/launcher/ddprun-store and
#                                              BUILD_DIR/scripts/bench/ddprun-store-init-storm are used as built)
#
# Prints Markdown on stdout. Takes about 2 minutes on 2 quiet CPUs. Exit codes: 0 done, 1 a program is missing.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build}")
for program in "$build/launcher/ddprun-store" "$build/scripts/bench/ddprun-store-init-storm"; do
  if [[ ! -x $program ]]; then
    echo "bench-store-auth: $program is missing: build it (cmake -DDDPRUN_BUILD_BENCHMARKS=ON, ninja bench)" >&2
    exit 1
  fi
done
/usr/bin/python3 "$repo/scripts/bench/store_auth_bench.py" --store "$build/launcher/ddprun-store" \
  --connections "${BENCH_AUTH_CONNECTIONS:-500}"
echo
BENCH_BUILD=0 BENCH_SCALE_SERVERS=ddprun,ddprun-secret BENCH_SCALE_RANKS=${BENCH_SCALE_RANKS:-16000} \
  "$repo/scripts/bench-store-scale.sh" "$build"
