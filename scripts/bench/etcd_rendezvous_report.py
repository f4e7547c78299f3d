#!/usr/bin/python3
"""The Markdown report of scripts/bench-etcd-rendezvous.sh, from its raw JSON lines.

    etcd_rendezvous_report.py RESULTS LOAD_BEFORE LOAD_AFTER REPEAT BUILD_TYPE ETCD_VERSION NOT_MEASURED_26

RESULTS holds one JSON line per run, tagged with "kind" (ddprun-etcd, ddprun-etcd-v2, torch-etcd,
torch-etcd-v2, torch26-etcd, torch26-etcd-v2, ddprun-c10d) and, for the etcd kinds, etcd_requests_per_node.
NOT_MEASURED_26: why torch 2.x is not in the table ("" when it is). Prints Markdown on stdout.
"""
import json
import os
import statistics
import sys

from bench_harness import cpu_model

path, load_before, load_after, repeat, build_type, etcd_version, not_measured26 = sys.argv[1:8]
runs = {}
for line in open(path):
    r = json.loads(line)
    runs.setdefault((r["kind"], r["nodes"]), []).append(r)


def median_ok(kind, n, get):
    vals = [get(r) for r in runs.get((kind, n), []) if r.get("ok") and get(r) is not None]
    return statistics.median(vals) if vals else None


def wall(kind, n):
    """'median (min–max)' of the wall time, and the median in ms (None when no run succeeded)."""
    rs = runs.get((kind, n), [])
    ok = [r["wall_ms"] for r in rs if r.get("ok")]
    failed = len(rs) - len(ok)
    if not ok:
        return ("failed" if rs else "—"), None
    med = statistics.median(ok)
    unit, div = ("s", 1000) if med >= 1000 else ("ms", 1)
    f = (lambda v: f"{v / div:.2f}") if unit == "s" else (lambda v: f"{v:.0f}")  # noqa: E731
    text = f"{f(med)} {unit} ({f(min(ok))}–{f(max(ok))})"
    if failed:
        text += f", {failed} failed"
    return text, med


def ratio(a, b):
    if not a or not b:
        return "—"
    q = a / b
    return f"{q:.2f}×" if q < 10 else f"{q:.0f}×"


cpu = cpu_model()
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
versions = sorted({r["torch"] for rs in runs.values() for r in rs if r.get("torch")})
print(f"Machine: {os.cpu_count()} CPUs, {cpu}, {mem / 2**20:.0f} GiB; load average before {load_before}, "
      f"after {load_after}; ddprun build {build_type}; {etcd_version}, 3 members on 127.0.0.1. Median of "
      f"{repeat} runs (fastest–slowest), min = max = N. torch versions: {', '.join(versions) or '—'}.")
if not_measured26:
    print(f"\ntorch 2.6: not measured: {not_measured26}.")
print()

has26 = any(k[0].startswith("torch26") for k in runs)
torches = [("torch", "torch 1.13")] + ([("torch26", "torch 2.6")] if has26 else [])
head, sep = "| N |", "|---:|"
for backend in ("etcd", "etcd-v2"):
    head += f" ddprun {backend} |"
    sep += "---:|"
    for kind, name in torches:
        head += f" {name} {backend} | ddprun ÷ {name} |"
        sep += "---:|---:|"
head += " ddprun c10d (own store) |"
sep += "---:|"
print(head)
print(sep)
for n in sorted({k[1] for k in runs}):
    line = f"| {n} |"
    for backend in ("etcd", "etcd-v2"):
        d_text, d = wall(f"ddprun-{backend}", n)
        line += f" {d_text} |"
        for kind, _ in torches:
            t_text, t = wall(f"{kind}-{backend}", n)
            line += f" {t_text} | {ratio(d, t)} |"
    line += f" {wall('ddprun-c10d', n)[0]} |"
    print(line)

print("\netcd requests per node (all members' etcd_http_received_total over the whole process, setup "
      "included; a watch counts once; a PUT is a raft write, a GET is served by the member asked), setup time "
      "(building the N handlers, before the clock starts) and "
      "the round's phases (first join -> first node returned / last node returned), medians:\n")
print("| configuration | N | etcd requests/node | of which GET / PUT / DELETE | setup | first return / last return |")
print("|---|---:|---:|---:|---:|---:|")
kinds = ["ddprun-etcd"] + [f"{k}-etcd" for k, _ in torches] + ["ddprun-etcd-v2"] + \
    [f"{k}-etcd-v2" for k, _ in torches]
names = {"ddprun": "ddprun", "torch": "torch 1.13", "torch26": "torch 2.6"}
for kind in kinds:
    who, backend = kind.split("-", 1)
    for n in sorted({k[1] for k in runs if k[0] == kind}):
        req = median_ok(kind, n, lambda r: r.get("etcd_requests_per_node"))
        setup = median_ok(kind, n, lambda r: r.get("setup_ms"))
        first = median_ok(kind, n, lambda r: r.get("phases_ms", {}).get("first_node_returned"))
        last = median_ok(kind, n, lambda r: r.get("phases_ms", {}).get("last_node_returned"))
        split = " / ".join(
            "—" if v is None else f"{v:.1f}"
            for v in (median_ok(kind, n, lambda r, m=m: r.get("etcd_requests_per_node_by_method", {}).get(m, 0))
                      for m in ("GET", "PUT", "DELETE")))
        fmt = lambda v, unit="": "—" if v is None else f"{v:.0f}{unit}"  # noqa: E731
        print(f"| {names[who]} {backend} | {n} | {'—' if req is None else f'{req:.1f}'} | {split} "
              f"| {fmt(setup, ' ms')} | {fmt(first)} / {fmt(last)} ms |")

for n in sorted({k[1] for k in runs if k[0] == "ddprun-c10d"}):
    req = median_ok("ddprun-c10d", n, lambda r: r.get("requests_per_node"))
    first, last = (median_ok("ddprun-c10d", n, lambda r, p=p: r.get("phases_ms", {}).get(p))
                   for p in ("first_node_returned", "last_node_returned"))
    first, last = ("—" if v is None else f"{v:.0f}" for v in (first, last))
    print(f"| ddprun c10d (ddprun store requests, round only) | {n} | {'—' if req is None else f'{req:.1f}'} "
          f"| — | — | {first} / {last} ms |")

for rs in runs.values():
    for r in rs:
        if not r.get("ok"):
            print(f"\nFailed: {r['kind']} N={r['nodes']}: {r.get('error', '?')}")
