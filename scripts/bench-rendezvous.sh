#!/usr/bin/env bash
# Elastic rendezvous at scale: ddprun's DynamicRendezvous (ddprun-rendezvous-sim: N real DynamicRendezvous
# nodes, a thread each, through one ddprun store on loopback; ddprun-rendezvous-replay: the same requests
# from one event-driven client thread, so that the clients cost little) next to torch's own c10d rendezvous
# (scripts/bench/torch_c10d_rendezvous_sim.py, against torch's TCPStore server and against ddprun-store) of
# torch 1.13 (this machine's /usr/bin/python3) and of torch 2.6 (scripts/torch26-python, the Debian 13 root of
# scripts/torch26-root.sh, when it is built), in one run.
#
#   scripts/bench-rendezvous.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build-bench, Release)
#
# Each configuration runs RDZV_REPEAT times; the tables show the median wall time (first join -> every node
# has its rank) with the fastest and slowest run, the store requests per node during the round, and the CPU
# time the store and the simulated nodes used in the round (wall time depends on what else runs on the
# machine; the CPU time hardly does). Prints Markdown on stdout, with the load average (/proc/loadavg, as
# `uptime` shows it) before and after; the raw JSON lines are kept in
# BENCH_RESULTS_DIR/bench-rendezvous-results.jsonl (default BUILD_DIR). About 4 minutes on 2 cores.
#
# Environment: RDZV_NODES (default "16 32 64 256 1024 4096"), RDZV_ELASTIC_NODES (runs with --nnodes N/2:N, default
# "64 1024 4096"), RDZV_REPLAY_NODES (the replay alone, default "16000": the thread simulation opens two
# connections per node to one in-process store, so it stops near 9,900 nodes at this machine's 20,000
# descriptors, while the replay opens one per node and runs its store in a process of its own), TORCH_NODES (default "16 32 64"), RDZV_REPEAT (default 3), RDZV_TIMEOUT (seconds per run,
# default 120), TORCH_PYTHON (a Python with torch 1.13, default /usr/bin/python3), TORCH26_PYTHON (a Python
# with torch 2.x, default scripts/torch26-python when the root exists; "none" leaves torch 2.x out),
# BENCH_BUILD (1: configure and build BUILD_DIR as Release; 0: use BUILD_DIR as it is, e.g. the shared
# RelWithDebInfo build, without touching it).
# The torch 2.6 simulation runs inside the root; its ddprun-store runs outside (the host's libraries), started
# by torch_c10d_rendezvous_sim.py --in.
# Exit codes: 0 done (a failed run shows in the tables); 1 the build failed or BUILD_DIR lacks a program.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build-bench}
read -r -a nodes <<<"${RDZV_NODES:-16 32 64 256 1024 4096}"
read -r -a elastic_nodes <<<"${RDZV_ELASTIC_NODES:-64 1024 4096}"
read -r -a replay_nodes <<<"${RDZV_REPLAY_NODES:-16000}"
read -r -a torch_nodes <<<"${TORCH_NODES:-16 32 64}"
repeat=${RDZV_REPEAT:-3}
timeout=${RDZV_TIMEOUT:-120}
python=${TORCH_PYTHON:-/usr/bin/python3}
python26=${TORCH26_PYTHON:-}
if [[ -z $python26 ]] && "$repo/scripts/torch26-root.sh" path >/dev/null 2>&1; then
  python26=$repo/scripts/torch26-python
fi
[[ $python26 == none ]] && python26=""

log() { echo "bench-rendezvous: $*" >&2; }

if [[ ${BENCH_BUILD:-1} == 0 ]]; then
  log "using $build as built (BENCH_BUILD=0)"
else
  log "building in $build (Release)"
  mkdir -p "$build"
  if ! { cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_BUILD_TESTS=OFF \
    -DDDPRUN_BUILD_BENCHMARKS=ON &&
    ninja -C "$build" -j2 ddprun-rendezvous-sim ddprun-rendezvous-replay ddprun-store; } >"$build/bench-rendezvous-build.log" 2>&1; then
    cat "$build/bench-rendezvous-build.log" >&2
    log "build failed"
    exit 1
  fi
fi
sim=$build/scripts/bench/ddprun-rendezvous-sim
replay=$build/scripts/bench/ddprun-rendezvous-replay
store=$build/launcher/ddprun-store
torch_sim=$repo/scripts/bench/torch_c10d_rendezvous_sim.py
for program in "$sim" "$replay" "$store"; do
  [[ -x $program ]] && continue
  [[ $program == "$store" ]] ||
    hint=": the benchmark programs are built only when $build is configured with -DDDPRUN_BUILD_BENCHMARKS=ON"
  log "missing $program${hint:-}"
  exit 1
done
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null || true)

mkdir -p "${BENCH_RESULTS_DIR:-$build}"
results=${BENCH_RESULTS_DIR:-$build}/bench-rendezvous-results.jsonl
: >"$results"

# record KIND CMD...: runs one simulation; its JSON line, tagged with KIND, goes to the results.
record() {
  local kind=$1 line
  shift
  line=$("$@" | tail -n 1) || true
  if [[ $line == \{* ]]; then
    echo "{\"kind\":\"$kind\",${line#\{}" >>"$results"
    log "$kind: $line"
  else
    log "$kind: no result from: $*"
  fi
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((i = 0; i < repeat; i++)); do
  for n in "${nodes[@]}"; do
    record ddprun "$sim" --nodes "$n" --timeout "$timeout"
    record replay "$replay" --nodes "$n" --timeout "$timeout"
  done
  for n in "${replay_nodes[@]}"; do  # beyond the thread simulation's reach: the replay alone
    record replay "$replay" --nodes "$n" --timeout "$timeout"
  done
  for n in "${elastic_nodes[@]}"; do
    record ddprun-elastic "$sim" --nodes "$n" --min $((n / 2)) --last-call-ms 30000 --timeout "$timeout"
    record replay-elastic "$replay" --nodes "$n" --min $((n / 2)) --timeout "$timeout"
  done
  for n in "${torch_nodes[@]}"; do
    record torch "$python" "$torch_sim" --nodes "$n" --store torch --timeout "$timeout"
    record torch-on-ddprun-store "$python" "$torch_sim" --nodes "$n" --store ddprun --ddprun-store "$store" \
      --timeout "$timeout"
    if [[ -n $python26 ]]; then
      record torch26 "$python" "$torch_sim" --in "$python26" --nodes "$n" --store torch --timeout "$timeout"
      record torch26-on-ddprun-store "$python" "$torch_sim" --in "$python26" --nodes "$n" --store ddprun \
        --ddprun-store "$store" --timeout "$timeout"
    fi
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- report ------------------------------------------------------------------------------------------------
"$python" - "$results" "$load_before" "$load_after" "$repeat" "${build_type:-?}" <<'EOF'
import json, os, statistics, sys

path, load_before, load_after, repeat, build_type = sys.argv[1:6]
runs = {}
for line in open(path):
    r = json.loads(line)
    runs.setdefault((r["kind"], r["nodes"]), []).append(r)

def wall(kind, n):
    rs = runs.get((kind, n), [])
    ok = [r["wall_ms"] for r in rs if r.get("ok")]
    failed = len(rs) - len(ok)
    if not ok:
        return "failed" if rs else "—", None
    med = statistics.median(ok)
    unit, div = ("s", 1000) if med >= 1000 else ("ms", 1)
    f = (lambda v: f"{v / div:.2f}") if unit == "s" else (lambda v: f"{v:.0f}")
    text = f"{f(med)} {unit} ({f(min(ok))}–{f(max(ok))})"
    if failed:
        text += f", {failed} failed"
    return text, med

def field(kind, n, get, fmt):
    vals = [get(r) for r in runs.get((kind, n), []) if r.get("ok") and get(r) is not None]
    return fmt(statistics.median(vals)) if vals else "—"

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
versions = {}
for (kind, _), rs in runs.items():
    for r in rs:
        if r.get("torch"):
            versions.setdefault(kind, r["torch"])
print(f"Machine: {os.cpu_count()} CPUs, {cpu}, {mem / 2**20:.0f} GiB; load average before {load_before}, "
      f"after {load_after}; ddprun build {build_type}. Median of {repeat} runs (fastest–slowest). torch "
      f"versions: {', '.join(sorted(set(versions.values()))) or '—'}.\n")

def cpu(kind, n, who):
    return field(kind, n, lambda r: r["cpu_ms"]["store"], lambda v: f"{v:.0f}") + " / " + \
        field(kind, n, lambda r: r["cpu_ms"][who], lambda v: f"{v:.0f} ms")

has26 = any(k[0].startswith("torch26") for k in runs)
head = ("| N | ddprun (min = max = N) | requests/node | torch 1.13 c10d, torch's server | "
        "torch 1.13 c10d on ddprun-store |")
sep = "|---:|---:|---:|---:|---:|"
if has26:
    head += " torch 2.6 c10d, torch's server | torch 2.6 c10d on ddprun-store |"
    sep += "---:|---:|"
head += " requests/node (torch 1.13" + (" / 2.6" if has26 else "") + ", incl. setup) | torch 1.13 ÷ ddprun |"
sep += "---:|---:|"
if has26:
    head += " torch 2.6 ÷ ddprun |"
    sep += "---:|"
print(head)
print(sep)
for n in sorted({k[1] for k in runs if k[0] in ("ddprun", "torch", "torch-on-ddprun-store", "torch26",
                                                 "torch26-on-ddprun-store")}):
    d_text, d = wall("ddprun", n)
    t_text, t = wall("torch", n)
    td_text, _ = wall("torch-on-ddprun-store", n)
    req = field("ddprun", n, lambda r: r["requests_per_node"], lambda v: f"{v:.1f}")
    treq = field("torch-on-ddprun-store", n, lambda r: r.get("requests_per_node_incl_setup"), lambda v: f"{v:.1f}")
    ratio = lambda a, b: f"{a / b:.0f}×" if a and b else "—"  # noqa: E731
    line = f"| {n} | {d_text} | {req} | {t_text} | {td_text} |"
    if has26:
        t26_text, t26 = wall("torch26", n)
        td26_text, _ = wall("torch26-on-ddprun-store", n)
        treq += " / " + field("torch26-on-ddprun-store", n, lambda r: r.get("requests_per_node_incl_setup"),
                              lambda v: f"{v:.1f}")
        line += f" {t26_text} | {td26_text} |"
    line += f" {treq} | {ratio(t, d)} |"
    if has26:
        line += f" {ratio(t26, d)} |"
    print(line)

print("\nddprun in detail: the thread-per-node simulation next to the replay (one client thread), fixed "
      "(min = max = N) and elastic (min = N/2, max = N, last_call_timeout 30 s, ended at once by the N-th "
      "arrival). CPU = CPU time used during the round by the store / by the simulated nodes.\n")
print("| N | min:max | sim wall | sim CPU store / nodes | replay wall | replay CPU store / client | "
      "requests/node | sim phases: last start / first return / last return |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for elastic in (False, True):
    sim_kind, rep_kind = ("ddprun-elastic", "replay-elastic") if elastic else ("ddprun", "replay")
    for n in sorted({k[1] for k in runs if k[0] in (sim_kind, rep_kind)}):
        s_text, _ = wall(sim_kind, n)
        r_text, _ = wall(rep_kind, n)
        req = field(sim_kind, n, lambda r: r["requests_per_node"], lambda v: f"{v:.2f}")
        phases = " / ".join(field(sim_kind, n, lambda r, p=p: r["phases_ms"][p], lambda v: f"{v:.0f}")
                            for p in ("last_node_started", "first_node_returned", "last_node_returned")) + " ms"
        mm = f"{n // 2}:{n}" if elastic else f"{n}:{n}"
        print(f"| {n} | {mm} | {s_text} | {cpu(sim_kind, n, 'nodes')} | {r_text} | {cpu(rep_kind, n, 'clients')} "
              f"| {req} | {phases} |")

errors = [r for rs in runs.values() for r in rs if not r.get("ok")]
for r in errors:
    print(f"\nFailed: {r['kind']} N={r['nodes']}: {r.get('error', '?')}")
EOF
log "raw results: $results"
