#!/usr/bin/env bash
# Rendezvous of N agents over etcd (issue 28): ddprun's --rdzv_backend etcd (EtcdRendezvous, torch's legacy
# etcd protocol) and etcd-v2 (DynamicRendezvous with an EtcdStore) next to torchrun's etcd-v2
# (DynamicRendezvousHandler over EtcdRendezvousBackend) and etcd (EtcdRendezvousHandler), and ddprun's c10d
# (ddprun-rendezvous-sim, its own store) for reference, in one run, against one 3-member etcd cluster.
#
#   scripts/bench-etcd-rendezvous.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build-bench, Release)
#
# The cluster: /usr/bin/etcd (3.4, --enable-v2=true), three members on 127.0.0.1 with free ports, data dirs in
# a temporary directory; stopped and removed on any exit (common.sh's traps). Each simulation is one process
# whose N nodes are threads with a handler each (scripts/bench/etcd_rendezvous_sim.cc,
# scripts/bench/torch_etcd_rendezvous_sim.py); node i talks to member i % 3 first. min = max = N: the round
# closes when the N-th node joins, so no last call is waited for. Each configuration runs RDZV_REPEAT times,
# each run with a fresh run id; the table shows the median wall time (first join -> every node has its rank)
# with the fastest and slowest run, and the etcd requests per node (the members' etcd_http_received_total,
# summed over the three, read before and after the process: setup included). Prints Markdown on stdout with
# the load average (/proc/loadavg) before and after; raw JSON lines go to
# BENCH_RESULTS_DIR/bench-etcd-rendezvous-results.jsonl (default BUILD_DIR). About 2 minutes on 2 loaded
# cores, 4 with torch 2.6.
#
# Environment: ETCD_NODES (default "4 16 64"), RDZV_REPEAT (default 3), RDZV_TIMEOUT (join timeout per run,
# seconds, default 120), TORCH_PYTHON (a Python with torch 1.13 and python3-etcd, default /usr/bin/python3),
# TORCH26_PYTHON (a Python with torch 2.x; default scripts/torch26-python when its root exists; "none" leaves
# it out; measured only when it can import etcd, else the output says why not), BENCH_BUILD (1: configure and
# build BUILD_DIR as Release; 0: use BUILD_DIR as it is, e.g. a RelWithDebInfo build).
# Exit codes: 0 done (a failed run shows in the table); 1 the build failed, a program is missing, or the etcd
# cluster did not start.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build-bench}
read -r -a nodes <<<"${ETCD_NODES:-4 16 64}"
repeat=${RDZV_REPEAT:-3}
timeout=${RDZV_TIMEOUT:-120}
python=${TORCH_PYTHON:-/usr/bin/python3}
python26=${TORCH26_PYTHON:-}
if [[ -z $python26 ]] && "$repo/scripts/torch26-root.sh" path >/dev/null 2>&1; then
  python26=$repo/scripts/torch26-python
fi
[[ $python26 == none ]] && python26=""

log() { echo "bench-etcd-rendezvous: $*" >&2; }
# shellcheck source=scripts/bench/common.sh
source "$repo/scripts/bench/common.sh"

etcd_sim=$build/scripts/bench/ddprun-etcd-rendezvous-sim
c10d_sim=$build/scripts/bench/ddprun-rendezvous-sim
torch_sim=$repo/scripts/bench/torch_etcd_rendezvous_sim.py
bench_build "$etcd_sim" "$c10d_sim"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null || true)

# torch 2.x: only when its Python has python-etcd (torch's etcd backends need it).
not_measured26=""
if [[ -z $python26 ]]; then
  not_measured26="no torch 2.x Python (TORCH26_PYTHON=none, or no root from scripts/torch26-root.sh)"
elif ! why=$("$python26" -c "import etcd" 2>&1); then
  not_measured26="$python26 cannot import etcd (python3-etcd is not installed in the torch 2.6 root):"
  not_measured26+=" $(tail -n 1 <<<"$why")"
  python26=""
fi
[[ -n $not_measured26 ]] && log "torch 2.x not measured: $not_measured26"

# ---- the etcd cluster ---------------------------------------------------------------------------------------
etcd_dir=$(mktemp -d "${TMPDIR:-/tmp}/bench-etcd.XXXXXX")
etcd_pids=()
stop_etcd() {
  local pid
  for pid in "${etcd_pids[@]}"; do stop_process "$pid"; done
  rm -rf "$etcd_dir"
}
at_exit stop_etcd
# Six distinct free ports (bound to port 0 together, then released; etcd binds them a moment later).
read -r -a ports <<<"$("$python" -c '
import socket
s = [socket.socket() for _ in range(6)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')"
cluster=""
for m in 0 1 2; do cluster+="${cluster:+,}m$m=http://127.0.0.1:${ports[m + 3]}"; done
endpoints=""
for m in 0 1 2; do
  endpoints+="${endpoints:+,}127.0.0.1:${ports[m]}"
  /usr/bin/etcd --name "m$m" --data-dir "$etcd_dir/m$m" --enable-v2=true --log-level error \
    --listen-client-urls "http://127.0.0.1:${ports[m]}" --advertise-client-urls "http://127.0.0.1:${ports[m]}" \
    --listen-peer-urls "http://127.0.0.1:${ports[m + 3]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${ports[m + 3]}" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "bench-$$" \
    >"$etcd_dir/m$m.log" 2>&1 &
  etcd_pids+=($!)
done
# Ready once every member answers /health with a leader (bounded: 30 s).
for m in 0 1 2; do
  for ((t = 0; t < 300; t++)); do
    curl -sf --max-time 1 "http://127.0.0.1:${ports[m]}/health" | grep -q '"health":"true"' && break
    sleep 0.1
  done
  if ((t == 300)); then
    cat "$etcd_dir/m$m.log" >&2
    log "etcd member m$m did not become healthy on 127.0.0.1:${ports[m]}"
    exit 1
  fi
done
log "etcd cluster: $endpoints ($(/usr/bin/etcd --version | head -n 1))"

# etcd_requests: the v2 API requests the three members have received so far (etcd_http_received_total),
# summed over the members, per HTTP method: "GET=120 PUT=43 ".
etcd_requests() {
  local m
  for m in 0 1 2; do curl -sf --max-time 2 "http://127.0.0.1:${ports[m]}/metrics" || true; done |
    awk -F'[{}"= ]+' '/^etcd_http_received_total[{]/ { s[$3] += $NF } END { for (k in s) printf "%s=%d ", k, s[k] }'
}

# requests_json BEFORE AFTER N: the JSON fields for the requests between two etcd_requests, per node.
requests_json() {
  awk -v b="$1" -v a="$2" -v n="$3" 'function load(text, into,  x, kv, i) {
      split(text, x, " ")
      for (i in x) { split(x[i], kv, "="); into[kv[1]] = kv[2] }
    }
    BEGIN {
      load(b, B); load(a, A); total = 0; out = ""
      for (k in A) { d = (A[k] - B[k]) / n; total += d; out = out sprintf(",\"%s\":%.1f", k, d) }
      printf "\"etcd_requests_per_node\":%.1f,\"etcd_requests_per_node_by_method\":{%s}", total, substr(out, 2)
    }'
}

mkdir -p "${BENCH_RESULTS_DIR:-$build}"
results=${BENCH_RESULTS_DIR:-$build}/bench-etcd-rendezvous-results.jsonl
: >"$results"

# record KIND N CMD...: runs one simulation; its JSON line, tagged with KIND and the etcd requests per node
# the run cost (setup included), goes to the results.
run_seq=0
rid=""
record() {
  local kind=$1 n=$2 line before after
  shift 2
  before=$(etcd_requests)
  # Not in $(...): INT/TERM must reach run_marked's `wait` in this shell, which the traps then end at once.
  run_marked "$@" >"$etcd_dir/run.out" || true
  after=$(etcd_requests)
  line=$(tail -n 1 "$etcd_dir/run.out")
  if [[ $line == \{* ]]; then
    line="{\"kind\":\"$kind\",$(requests_json "$before" "$after" "$n"),${line#\{}"
    echo "$line" >>"$results"
    log "$kind: $line"
  else
    log "$kind: no result from: $*"
    echo "{\"kind\":\"$kind\",\"nodes\":$n,\"ok\":false,\"error\":\"no result\"}" >>"$results"
  fi
}
# new_run_id: sets $rid to a run id no earlier run used (every run leaves its keys in etcd).
new_run_id() {
  run_seq=$((run_seq + 1))
  rid="bench-$$-$run_seq"
}

start_s=$(date +%s)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((i = 0; i < repeat; i++)); do
  for n in "${nodes[@]}"; do
    for backend in etcd etcd-v2; do
      new_run_id
      record "ddprun-$backend" "$n" "$etcd_sim" --backend "$backend" --nodes "$n" --endpoints "$endpoints" \
        --run-id "$rid" --timeout "$timeout"
      new_run_id
      record "torch-$backend" "$n" "$python" "$torch_sim" --backend "$backend" --nodes "$n" \
        --endpoints "$endpoints" --run-id "$rid" --timeout "$timeout"
      if [[ -n $python26 ]]; then
        new_run_id
        record "torch26-$backend" "$n" "$python26" "$torch_sim" --backend "$backend" --nodes "$n" \
          --endpoints "$endpoints" --run-id "$rid" --timeout "$timeout"
      fi
    done
    record ddprun-c10d "$n" "$c10d_sim" --nodes "$n" --timeout "$timeout"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
log "measured in $(($(date +%s) - start_s)) s"

"$python" "$repo/scripts/bench/etcd_rendezvous_report.py" "$results" "$load_before" "$load_after" "$repeat" \
  "${build_type:-?}" "$(/usr/bin/etcd --version | head -n 1)" "$not_measured26"
log "raw results: $results"
