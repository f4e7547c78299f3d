#!/usr/bin/env bash
# Rendezvous store benchmark: ddprun-store against torch 1.13's TCPStore server, and against ddprun-store as
# built from another commit (before/after a change), in one run, driven by the same load generators
# (ddprun-store-bench, closed-loop clients; ddprun-store-attack, hostile readers; legacy dialect).
#
#   scripts/bench-store.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build-bench, Release)
#
# Starts the servers on free ports; runs set/get/add with 1, 16, 64 and 256 clients on each, back to back,
# BENCH_REPEATS times (a cell shows the median run); then, per server, one run of get with 64 clients while
# 10,000 idle connections stay open (server RSS and descriptors are sampled then); reads each server's
# peak RSS (VmHWM); stops them. With BENCH_ATTACKS=1, then, for each ddprun server, each attack of
# ddprun-store-attack against a fresh server of its own (its RSS growth and a fresh client's round trip
# during the attack). Prints Markdown tables on stdout; the raw JSON lines are kept in
# BUILD_DIR/bench-store-results.jsonl. Takes about 3–4 minutes (the builds aside).
#
# Servers (BENCH_SERVERS, default "ddprun torch"): ddprun (this checkout's ddprun-store), torch (torch 1.13's
# TCPStore server), baseline (ddprun-store of the commit BENCH_BASELINE names, e.g. main: built once from
# `git archive` into BUILD_DIR/baseline-build, Release; rebuilt when the commit changes).
# Issue 26's before/after run: BENCH_BASELINE=main BENCH_SERVERS="baseline ddprun" BENCH_CLIENTS=64
# BENCH_OPS="set get add mix" BENCH_IDLE=0 BENCH_ATTACKS=1 BENCH_REPEATS=5 scripts/bench-store.sh
#
# Environment: BENCH_SECONDS (measured seconds per run, default 2), BENCH_REPEATS (default 3),
# BENCH_CLIENTS (default "1 16 64 256"), BENCH_OPS (default "set get add"; also mix: SET, GET, ADD in turn),
# BENCH_IDLE (idle connections, default 10000; 0: no idle run), BENCH_ATTACKS (1: run the attacks, default 0),
# BENCH_ATTACK_HOLD (seconds each attack is held after its last request, default 5), BENCH_BASELINE,
# BENCH_SERVERS, TORCH_PYTHON (a Python with torch, default /usr/bin/python3),
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
read -r -a ops <<<"${BENCH_OPS:-set get add}"
attacks=${BENCH_ATTACKS:-0}
attack_hold=${BENCH_ATTACK_HOLD:-5}

log() { echo "bench-store: $*" >&2; }
source "$repo/scripts/bench/common.sh"

# ---- build ---------------------------------------------------------------------------------------------
log "building in $build (Release)"
mkdir -p "$build"
if ! { cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF \
  -DDDPRUN_BUILD_BENCHMARKS=ON &&
  ninja -C "$build" -j2 bench; } >"$build/bench-build.log" 2>&1; then
  cat "$build/bench-build.log" >&2
  log "build failed"
  exit 1
fi
declare -A store_bin=([ddprun]=$build/launcher/ddprun-store)
bench_bin=$build/scripts/bench/ddprun-store-bench
attack_bin=$build/scripts/bench/ddprun-store-attack

# ---- the baseline: ddprun-store of another commit ---------------------------------------------------------
baseline_commit=""
if [[ " ${servers[*]} " == *" baseline "* ]]; then
  [[ -n ${BENCH_BASELINE:-} ]] || { log "the server 'baseline' needs BENCH_BASELINE (a git ref, e.g. main)"; exit 1; }
  baseline_commit=$(git -C "$repo" rev-parse --verify "$BENCH_BASELINE^{commit}") || exit 1
  base_src=$build/baseline-src base_build=$build/baseline-build
  if [[ ! -x $base_build/launcher/ddprun-store || $(cat "$base_build/commit" 2>/dev/null) != "$baseline_commit" ]]; then
    log "building ddprun-store of $BENCH_BASELINE ($baseline_commit) in $base_build (Release)"
    rm -rf "$base_src" && mkdir -p "$base_src" "$base_build"
    git -C "$repo" archive "$baseline_commit" | tar -x -C "$base_src"
    if ! { cmake -S "$base_src" -B "$base_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF \
      -DDDPRUN_WERROR=OFF -DDDPRUN_WITH_TORCH=OFF -DDDPRUN_WITH_CUDA=OFF &&
      ninja -C "$base_build" -j2 ddprun-store; } >"$base_build/build.log" 2>&1; then
      cat "$base_build/build.log" >&2
      log "baseline build failed"
      exit 1
    fi
    echo "$baseline_commit" >"$base_build/commit"
  fi
  store_bin[baseline]=$base_build/launcher/ddprun-store
fi

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
    ddprun | baseline) "${store_bin[$name]}" --port 0 --log-level warn >"$out" 2>&1 & ;;
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
if ((idle > 0)); then
  for server in "${servers[@]}"; do
    run_bench "$server" --op get --clients 64 --idle "$idle" --connect-timeout 120
  done
fi
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

# ---- attacks: each against a fresh server, so that its peak RSS is the attack's ----------------------------
if [[ $attacks == 1 ]]; then
  for attack in watch get; do
    for server in "${servers[@]}"; do
      [[ $server == torch ]] && continue
      stop_process "${pid[$server]}"
      start_server "$server" || exit 1
      line=$("$attack_bin" --port "${port[$server]}" --server-pid "${pid[$server]}" --label "$server" \
        --attack "$attack" --hold "$attack_hold") || true
      if [[ -n $line ]]; then
        echo "$line" >>"$results"
        log "$line"
      else
        log "ddprun-store-attack printed nothing for $server $attack"
      fi
    done
  done
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- report ------------------------------------------------------------------------------------------------
"$python" - "$results" "$load_before" "$load_after" "$seconds" "$idle" "$repeats" "$baseline_commit" \
  "$(git -C "$repo" rev-parse HEAD)$(git -C "$repo" diff --quiet HEAD || echo ' (uncommitted changes)')" <<'EOF'
import json, os, sys

path, load_before, load_after, seconds, idle, repeats, baseline, head = sys.argv[1:9]
runs, peak, died, attacks = {}, {}, set(), []
for line in open(path):
    r = json.loads(line)
    if "server_peak_rss_kb" in r:
        peak[r["label"]] = r["server_peak_rss_kb"]
    elif "server_died" in r:
        died.add(r["label"])
    elif "attack" in r:
        attacks.append(r)
    else:
        runs.setdefault((r["label"], r["op"], r["clients"], r["idle_requested"] > 0), []).append(r)
# The run with the median ops/s stands for its cell (its own latencies and CPU come with it).
runs = {k: sorted(v, key=lambda r: r["ops_per_s"])[len(v) // 2] for k, v in runs.items()}

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"Machine: {os.cpu_count()} CPUs, {cpu}; load average before {load_before}, after {load_after}.")
print(f"ddprun: {head}" + (f"; baseline: {baseline}" if baseline else "") + ".")
prio = "autogroup nice -20 (BENCH_HIGH_PRIORITY=1)" if os.environ.get("BENCH_PRIORITY_SET") else "normal priority"
print(f"Each cell: the median of {repeats} runs by ops/s (the idle run: 1), each {seconds} s measured after 0.5 s "
      f"of warm-up; one load-generator thread; {prio}.\n")

def cell(r):
    if r is None:
        return "—", "—"
    err = f" ({r['errors']} errors)" if r["errors"] else ""
    return f"{r['ops_per_s']:,.0f}{err}", f"{r['p50_us']:.0f} / {r['p99_us']:.0f}"

labels = {"ddprun": "ddprun", "torch": "torch 1.13", "baseline": f"ddprun {baseline[:10]} (baseline)"}
ops_order = ["set", "get", "add", "mix"]
keys = sorted({(k[1], k[2], k[3]) for k in runs}, key=lambda k: (k[2], ops_order.index(k[0]), k[1]))
cpu = lambda r: f"{r['server_cpu_us_per_op']:.1f}" if r and r.get("server_cpu_us_per_op", -1) >= 0 else "—"
# One table per pair: ddprun against torch, and ddprun against the baseline (before/after).
for other in ("torch", "baseline"):
    if not any(k[0] == other for k in runs) or not any(k[0] == "ddprun" for k in runs):
        continue
    print(f"| op | clients | ddprun ops/s | p50 / p99 µs | {labels[other]} ops/s | p50 / p99 µs | ops/s ratio "
          f"| server CPU µs/op ddprun / {other} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for op, clients, with_idle in keys:
        d, t = runs.get(("ddprun", op, clients, with_idle)), runs.get((other, op, clients, with_idle))
        ratio = f"{d['ops_per_s'] / t['ops_per_s']:.2f}×" if d and t and t["ops_per_s"] > 0 else "—"
        name = f"{op} + {idle} idle" if with_idle else op
        print(f"| {name} | {clients} | {' | '.join(cell(d))} | {' | '.join(cell(t))} | {ratio} | {cpu(d)} / {cpu(t)} |")
    print()

if any(k[3] for k in runs):
    print("| server | RSS before the idle run | RSS with idle + 64 active | idle connected / answering | server fds | peak RSS (VmHWM) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label in ("ddprun", "baseline", "torch"):
        r = next((v for k, v in runs.items() if k[0] == label and k[3]), None)
        if r is None:
            continue
        mib = lambda kb: f"{kb / 1024:.1f} MiB"
        hwm = "died" if label in died else mib(peak.get(label, 0))
        print(f"| {label} | {mib(r['server_rss_kb_before'])} | {mib(r['server_rss_kb'])} | "
              f"{r['idle_connected']} / {r['idle_alive']} of {r['idle_requested']} | {r['server_fds']} | {hwm} |")

if attacks:
    print("\nAttacks (ddprun-store-attack, each against a fresh server; RSS sampled every 50 ms; a fresh client's "
          "ADD round trip probed every 100 ms during the attack):\n")
    print("| server | attack | clients | value | RSS before | RSS growth (peak sample) | VmHWM growth "
          "| fresh client round trip: median / max | probes | server CPU / attack's time | attackers dropped | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    what = {"watch": lambda a: f"watch, {a['sets']} SETs", "get": lambda a: "GET, read slowly"}
    def trip(a):
        # A probe still unanswered at the end bounds the round trip from below.
        waited = a.get("probe_unanswered_ms", 0)
        if a["probes"] == 0:
            return f"none answered; one waited {waited:.0f} ms unanswered" if waited else "none"
        worst = f"{a['probe_max_ms']:.1f} ms"
        if waited > a["probe_max_ms"]:
            worst = f"> {waited:.0f} ms (unanswered at the end)"
        return f"{a['probe_p50_ms']:.1f} ms / {worst}"
    for a in sorted(attacks, key=lambda a: (a["attack"] != "watch", a["label"] != "baseline")):
        err = f"{a['errors']}: {a['first_error']}" if a["errors"] else "0"
        print(f"| {labels.get(a['label'], a['label'])} | {what[a['attack']](a)} | {a['clients']} | "
              f"{a['value_bytes'] / 1048576:g} MiB | {a['rss_before_kb'] / 1024:.1f} MiB | "
              f"{a['rss_growth_mib']:.1f} MiB | {a['hwm_growth_mib']:.1f} MiB | "
              f"{trip(a)} | {a['probes']} | {a.get('server_cpu_s', 0):.2f} s / {a.get('attack_s', 0):.1f} s | "
              f"{a['attackers_dropped']} | {err} |")
EOF
log "raw results: $results"
