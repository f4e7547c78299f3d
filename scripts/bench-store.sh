#!/usr/bin/env bash
# Rendezvous store benchmark: ddprun-store against torch 1.13's TCPStore server, in one run, driven by the
# same load generator (ddprun-store-bench, legacy dialect, closed-loop clients).
#
#   scripts/bench-store.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build-bench, Release)
#
# Starts both servers on free ports; runs set/get/add with 1, 16, 64 and 256 clients on each, back to back,
# BENCH_REPEATS times (a cell shows the median run); then, per server, one run of get with 64 clients while
# 10,000 idle connections stay open (server RSS and descriptors are sampled then); reads each server's
# peak RSS (VmHWM); stops them. Prints Markdown tables on stdout; the raw JSON lines are kept in
# BUILD_DIR/bench-store-results.jsonl. Takes about 3–4 minutes (the build aside).
#
# Environment: BENCH_SECONDS (measured seconds per run, default 2), BENCH_REPEATS (default 3),
# BENCH_CLIENTS (default "1 16 64 256"), BENCH_IDLE (idle connections, default 10000), BENCH_SERVERS
# (default "ddprun torch"), TORCH_PYTHON (a Python with torch, default /usr/bin/python3),
# BENCH_HIGH_PRIORITY=1 (root only: run in a session of its own whose autogroup has nice -20, so that other
# work on a shared machine barely disturbs the measurement; servers and load generator alike).
# Exit codes: 0 done (a failed run shows in the tables), 1 build or server start failed.
set -euo pipefail

if [[ ${BENCH_HIGH_PRIORITY:-0} == 1 && -z ${BENCH_PRIORITY_SET:-} ]]; then
  # With autogroups (Linux default) `nice` alone only ranks processes within one session: take a session.
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
  exec env BENCH_PRIORITY_SET=1 setsid -w bash -c \
    'echo -20 2>/dev/null >/proc/self/autogroup || { echo "bench-store: BENCH_HIGH_PRIORITY=1 needs root" >&2; exit 1; }
     exec nice -n -20 "$0" "$@"' "${BASH_SOURCE[0]}" "$@"
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build-bench}
seconds=${BENCH_SECONDS:-2}
repeats=${BENCH_REPEATS:-3}
read -r -a client_counts <<<"${BENCH_CLIENTS:-1 16 64 256}"
idle=${BENCH_IDLE:-10000}
read -r -a servers <<<"${BENCH_SERVERS:-ddprun torch}"
python=${TORCH_PYTHON:-/usr/bin/python3}
ops=(set get add)

log() { echo "bench-store: $*" >&2; }
source "$repo/scripts/bench/common.sh"

# ---- build ---------------------------------------------------------------------------------------------
log "building in $build (Release)"
mkdir -p "$build"
if ! { cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF &&
  ninja -C "$build" -j2 bench; } >"$build/bench-build.log" 2>&1; then
  cat "$build/bench-build.log" >&2
  log "build failed"
  exit 1
fi
store_bin=$build/launcher/ddprun-store
bench_bin=$build/scripts/bench/ddprun-store-bench

# ---- descriptors: each side of 10,000 idle connections needs 10,000 descriptors --------------------------
hard=$(ulimit -Hn)
if [[ $hard != unlimited ]]; then
  ulimit -n "$hard"
  if ((hard < idle + 1024)); then
    log "the hard descriptor limit is $hard: lowering the idle connections from $idle to $((hard - 1024))"
    idle=$((hard - 1024))
  fi
else
  ulimit -n 1048576 2>/dev/null || true
fi
log "ulimit -n: $(ulimit -n)"

# ---- servers -----------------------------------------------------------------------------------------------
work=$(mktemp -d)
declare -A pid port
stop_servers() {
  local p
  for p in "${pid[@]}"; do stop_process "$p"; done
  rm -rf "$work"
}
at_exit stop_servers

# The torch 1.13 server: a master TCPStore (its daemon thread serves clients) in a Python that then sleeps.
torch_server='
import time, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print("torch-store listening on 127.0.0.1:%d" % store.port, flush=True)
while True:
    time.sleep(3600)
'

# start_server NAME: starts it, waits (30 s at most) for its "listening on ...:PORT" line.
start_server() {
  local name=$1 out=$work/$1.out
  case $name in
    ddprun) "$store_bin" --port 0 --log-level warn >"$out" 2>&1 & ;;
    torch) "$python" -u -c "$torch_server" >"$out" 2>&1 & ;;
    *)
      log "unknown server '$name'"
      return 1
      ;;
  esac
  pid[$name]=$!
  local i
  for ((i = 0; i < 300; i++)); do
    port[$name]=$(sed -n 's/.* listening on .*:\([0-9][0-9]*\)$/\1/p' "$out" | head -n 1)
    [[ -n ${port[$name]} ]] && return 0
    kill -0 "${pid[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  cat "$out" >&2
  log "$name did not start"
  return 1
}

# run_bench SERVER ARGS...: one load-generator run; its JSON line goes to the results (even a failed one).
run_bench() {
  local name=$1 line
  shift
  line=$("$bench_bin" --port "${port[$name]}" --server-pid "${pid[$name]}" --label "$name" \
    --seconds "$seconds" "$@") || true
  if [[ -n $line ]]; then
    echo "$line" >>"$results"
    log "$line"
  else
    log "load generator printed nothing for $name $*"
  fi
}

results=$build/bench-store-results.jsonl
: >"$results"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for server in "${servers[@]}"; do
  start_server "$server" || exit 1
  log "$server listening on port ${port[$server]} (pid ${pid[$server]})"
done
# Both servers stay up; each measurement runs on one server then the other, back to back, the order
# alternating between repetitions, so that a change in background load hits both alike.
order=("${servers[@]}")
for ((rep = 1; rep <= repeats; rep++)); do
  for op in "${ops[@]}"; do
    for clients in "${client_counts[@]}"; do
      for server in "${order[@]}"; do
        run_bench "$server" --op "$op" --clients "$clients"
      done
    done
  done
  mapfile -t order < <(printf '%s\n' "${order[@]}" | tac)
done
for server in "${servers[@]}"; do
  run_bench "$server" --op get --clients 64 --idle "$idle" --connect-timeout 120
done
for server in "${servers[@]}"; do
  if kill -0 "${pid[$server]}" 2>/dev/null; then
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/${pid[$server]}/status")
    echo "{\"label\":\"$server\",\"server_peak_rss_kb\":$hwm}" >>"$results"
  else
    log "$server died during the runs:"
    cat "$work/$server.out" >&2
    echo "{\"label\":\"$server\",\"server_died\":true}" >>"$results"
  fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- report ------------------------------------------------------------------------------------------------
"$python" - "$results" "$load_before" "$load_after" "$seconds" "$idle" "$repeats" <<'EOF'
import json, os, sys

path, load_before, load_after, seconds, idle, repeats = sys.argv[1:7]
runs, peak, died = {}, {}, set()
for line in open(path):
    r = json.loads(line)
    if "server_peak_rss_kb" in r:
        peak[r["label"]] = r["server_peak_rss_kb"]
    elif "server_died" in r:
        died.add(r["label"])
    else:
        runs.setdefault((r["label"], r["op"], r["clients"], r["idle_requested"] > 0), []).append(r)
# The run with the median ops/s stands for its cell (its own latencies and CPU come with it).
runs = {k: sorted(v, key=lambda r: r["ops_per_s"])[len(v) // 2] for k, v in runs.items()}

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"Machine: {os.cpu_count()} CPUs, {cpu}; load average before {load_before}, after {load_after}.")
prio = "autogroup nice -20 (BENCH_HIGH_PRIORITY=1)" if os.environ.get("BENCH_PRIORITY_SET") else "normal priority"
print(f"Each cell: the median of {repeats} runs by ops/s (the idle run: 1), each {seconds} s measured after 0.5 s "
      f"of warm-up; one load-generator thread; {prio}.\n")

def cell(r):
    if r is None:
        return "—", "—"
    err = f" ({r['errors']} errors)" if r["errors"] else ""
    return f"{r['ops_per_s']:,.0f}{err}", f"{r['p50_us']:.0f} / {r['p99_us']:.0f}"

print("| op | clients | ddprun ops/s | p50 / p99 µs | torch 1.13 ops/s | p50 / p99 µs | ops/s ratio "
      "| server CPU µs/op ddprun / torch |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
keys = sorted({(k[1], k[2], k[3]) for k in runs}, key=lambda k: (k[2], ["set", "get", "add"].index(k[0]), k[1]))
for op, clients, with_idle in keys:
    d, t = runs.get(("ddprun", op, clients, with_idle)), runs.get(("torch", op, clients, with_idle))
    ratio = f"{d['ops_per_s'] / t['ops_per_s']:.2f}×" if d and t and t["ops_per_s"] > 0 else "—"
    cpu = lambda r: f"{r['server_cpu_us_per_op']:.1f}" if r and r.get("server_cpu_us_per_op", -1) >= 0 else "—"
    name = f"{op} + {idle} idle" if with_idle else op
    print(f"| {name} | {clients} | {' | '.join(cell(d))} | {' | '.join(cell(t))} | {ratio} | {cpu(d)} / {cpu(t)} |")

print("\n| server | RSS before the idle run | RSS with idle + 64 active | idle connected / answering | server fds | peak RSS (VmHWM) |")
print("|---|---:|---:|---:|---:|---:|")
for label in ("ddprun", "torch"):
    r = next((v for k, v in runs.items() if k[0] == label and k[3]), None)
    if r is None:
        continue
    mib = lambda kb: f"{kb / 1024:.1f} MiB"
    hwm = "died" if label in died else mib(peak.get(label, 0))
    print(f"| {label} | {mib(r['server_rss_kb_before'])} | {mib(r['server_rss_kb'])} | "
          f"{r['idle_connected']} / {r['idle_alive']} of {r['idle_requested']} | {r['server_fds']} | {hwm} |")
EOF
log "raw results: $results"
