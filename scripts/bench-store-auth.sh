#!/usr/bin/env bash
# The cost of the store's authentication (--rdzv_secret_file, MUNGE under Slurm: docs/security.md), in one run:
#   0. ddprun-auth-handshake-bench: StoreClient connections to an open store, one with the job's secret and one
#      with MUNGE (a private munged this script starts in a temporary directory: needs root and munged; without
#      them the MUNGE row is left out, and said);
#   1. scripts/bench/store_auth_bench.py: an agent's connection (connect, VALIDATE, PING) to ddprun-store without
#      a secret, beside the same plus the AUTH handshake to ddprun-store --secret-file (BENCH_AUTH_CONNECTIONS,
#      500 each, alternating);
#   2. scripts/bench-store-scale.sh with the servers ddprun and ddprun-secret: N worker clients initialising at
#      once (BENCH_SCALE_RANKS, default 16000), admitted by address, every request checked for the job's keys.
#   3. ddprun-rendezvous-replay --nodes BENCH_REPLAY_NODES (16000) open, with --secret and with MUNGE (the private
#      munged), 3 runs each, alternating: the elastic rendezvous's first round on connections that did AUTH, and
#      the handshakes of all nodes' connections timed apart, with the store's io-thread CPU and the round trips
#      of a PING sent meanwhile on a connection of its own (what a heartbeat waits while the nodes authenticate).
#
#   scripts/bench-store-auth.sh [BUILD_DIR]   (default <repo>/build; BUILD_DIR/launcher/ddprun-store and
#                                              BUILD_DIR/scripts/bench/ddprun-store-init-storm are used as built)
#
# Prints Markdown on stdout. Takes about 3 minutes on 2 quiet CPUs. Exit codes: 0 done, 1 a program is missing.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$repo/build}")
for program in "$build/launcher/ddprun-store" "$build/scripts/bench/ddprun-store-init-storm" \
  "$build/scripts/bench/ddprun-auth-handshake-bench" "$build/scripts/bench/ddprun-rendezvous-replay"; do
  if [[ ! -x $program ]]; then
    echo "bench-store-auth: $program is missing: build it (cmake -DDDPRUN_BUILD_BENCHMARKS=ON, ninja bench)" >&2
    exit 1
  fi
done
munge_args=()
if [[ $EUID -eq 0 ]] && command -v munged >/dev/null && id munge >/dev/null 2>&1; then
  munge_dir=$(mktemp -d /tmp/ddprun-bench-munge-XXXXXX)
  trap '[[ -s $munge_dir/munged.pid ]] && kill "$(cat "$munge_dir/munged.pid")"; rm -rf "$munge_dir"' EXIT
  head -c 1024 /dev/urandom >"$munge_dir/munge.key"
  chown -R munge:munge "$munge_dir" && chmod 0755 "$munge_dir" && chmod 0400 "$munge_dir/munge.key"
  runuser -u munge -- munged --key-file="$munge_dir/munge.key" --socket="$munge_dir/munge.socket" \
    --pid-file="$munge_dir/munged.pid" --log-file="$munge_dir/munged.log" --seed-file="$munge_dir/munged.seed"
  munge_args=(--munge-socket "$munge_dir/munge.socket")
else
  echo "(no MUNGE row: a private munged needs root and munged, scripts/install-deps.sh)"
fi
"$build/scripts/bench/ddprun-auth-handshake-bench" --connections "${BENCH_AUTH_CONNECTIONS:-500}" "${munge_args[@]}"
echo
/usr/bin/python3 "$repo/scripts/bench/store_auth_bench.py" --store "$build/launcher/ddprun-store" \
  --connections "${BENCH_AUTH_CONNECTIONS:-500}"
echo
BENCH_BUILD=0 BENCH_SCALE_SERVERS=ddprun,ddprun-secret BENCH_SCALE_RANKS=${BENCH_SCALE_RANKS:-16000} \
  "$repo/scripts/bench-store-scale.sh" "$build"
echo
nodes=${BENCH_REPLAY_NODES:-16000}
echo "ddprun-rendezvous-replay --nodes $nodes, 3 runs each, alternating; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| store | round wall (first round, all nodes returned) | store CPU in the round | handshakes of all $nodes connections: wall | store CPU | of which its io thread | a PING meanwhile: median / p99 / max |"
echo "|---|---:|---:|---:|---:|---:|---:|"
modes=("" --secret)
[[ ${#munge_args[@]} -gt 0 ]] && modes+=("--munge-socket=${munge_args[1]}")
for _ in 1 2 3; do
  for flag in "${modes[@]}"; do
    "$build/scripts/bench/ddprun-rendezvous-replay" --nodes "$nodes" $flag --timeout 300 | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
if not d["ok"]:
    sys.exit("ddprun-rendezvous-replay: " + d.get("error", "failed"))
name = "MUNGE (AUTH on every connection)" if d.get("munge") else \
    "--secret (AUTH on every connection)" if d["secret"] else "open"
w, c, h, hc = d["wall_ms"], d["cpu_ms"]["store"], d["handshake_ms"], d["cpu_ms"]["store_handshake"]
io = d["cpu_ms"]["store_io_thread"]
pm, p99, pmax = d["probe_ms"]["median"], d["probe_ms"]["p99"], d["probe_ms"]["max"]
print(f"| {name} | {w / 1e3:.2f} s | {c / 1e3:.2f} s | {h / 1e3:.2f} s | {hc / 1e3:.2f} s | {io / 1e3:.2f} s "
      f"| {pm:.2f} / {p99:.2f} / {pmax:.0f} ms |")'
  done
done
