"""Store at scale: N ranks initialising at once against one store, ddprun's against torch's, in one run.

Run by scripts/bench-store-scale.sh; standard library only. For every N in --ranks and every server, --reps
runs, each against a fresh server: the server is started, ddprun-store-init-storm drives N simulated ranks
through what init_process_group does with the store (connect, VALIDATE in the 2.x dialect, ADD to a counter,
WAIT for the barrier key, GET; see scripts/bench/store_init_storm.cc), the server is stopped.

Servers (--servers):
  ddprun         ddprun-store, the clients in the 2.x (modern) dialect
  ddprun-legacy  ddprun-store, the clients in torch 1.13's (legacy) dialect
  ddprun-secret  ddprun-store --secret-file (docs/security.md), the 2.x dialect: the ranks are worker clients
                 on the store's own host, admitted by address, each request checked for the job's keys
  torch-1.13     torch 1.13's TCPStore server (Debian 12, /usr/bin/python3), legacy dialect
  torch-2.6      torch 2.6's TCPStore server in the Debian 13 root, modern dialect, use_libuv=False: Debian's
                 torch 2.6 is built without libuv, so this is the legacy (poll-based) server backend

Exit codes: 0 done (failed runs show in the table), 2 bad arguments.
"""

import argparse
import tempfile
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from bench_harness import add_json_arg, load_average, machine_line, write_json

SERVER_PY = r"""
import os, sys, time
import torch.distributed as dist
args = ("127.0.0.1", int(sys.argv[1]))
kw = dict(is_master=True, wait_for_workers=False, timeout=__import__("datetime").timedelta(seconds=600))
try:
    store = dist.TCPStore(*args, use_libuv=False, **kw)  # torch >= 2.2
except TypeError:
    store = dist.TCPStore(*args, **kw)  # torch 1.13
print(os.getpid(), flush=True)
time.sleep(3600)
"""

TEXT = {
    "ddprun": ("ddprun-store", "2.x (modern)"),
    "ddprun-legacy": ("ddprun-store", "1.13 (legacy)"),
    "ddprun-secret": ("ddprun-store --secret-file", "2.x (modern)"),
    "torch-1.13": ("torch 1.13 TCPStore", "1.13 (legacy)"),
    "torch-2.6": ("torch 2.6 TCPStore (no libuv)", "2.x (modern)"),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, name, port):
    """(Popen, pid of the serving process) once it listens."""
    if name.startswith("ddprun"):
        secret = []
        if name == "ddprun-secret":
            fd, path = tempfile.mkstemp(prefix="ddprun-bench-secret-")  # mode 600
            os.write(fd, os.urandom(32).hex().encode())
            os.close(fd)
            secret = ["--secret-file", path]
        p = subprocess.Popen([args.store, "--host", "127.0.0.1", "--port", str(port), "--log-level", "error",
                              *secret], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        p.stdout.readline()  # "ddprun-store listening on ...": the secret file was read before
        if secret:
            os.unlink(secret[1])
        return p, p.pid
    argv = ([args.python] if name == "torch-1.13" else [args.torch26_root, "run", "/usr/bin/python3"]) + \
        ["-c", SERVER_PY, str(port)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline().strip()
    if not line.isdigit():
        p.kill()
        raise RuntimeError(f"{name}: the server did not start")
    return p, int(line)


def one(args, name, ranks):
    port = free_port()
    server, pid = start_server(args, name, port)
    try:
        dialect = "modern" if name in ("ddprun", "ddprun-secret", "torch-2.6") else "legacy"
        out = subprocess.run([args.storm, "--port", str(port), "--ranks", str(ranks), "--dialect", dialect,
                              "--server-pid", str(pid), "--timeout", str(args.timeout), "--label", name],
                             capture_output=True, text=True, timeout=args.timeout + 60)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
        result = json.loads(line)
        result["rc"] = out.returncode
        if not line or line == "{}":
            result["first_error"] = out.stderr.strip()[-300:]
        return result
    finally:
        for victim in {server.pid, pid}:
            try:
                os.kill(victim, 9)
            except OSError:
                pass
        server.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="ddprun-store")
    ap.add_argument("--storm", required=True, help="ddprun-store-init-storm")
    ap.add_argument("--python", default="/usr/bin/python3", help="Python with torch 1.13")
    ap.add_argument("--torch26-root", help="scripts/torch26-root.sh")
    ap.add_argument("--servers", default="ddprun,ddprun-legacy,torch-1.13,torch-2.6")
    ap.add_argument("--ranks", default="1000,4000,16000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run before it counts as failed")
    add_json_arg(ap)
    args = ap.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    for s in servers:
        if s not in TEXT:
            ap.error(f"unknown server {s}")
        if s == "torch-2.6" and not args.torch26_root:
            ap.error("torch-2.6 needs --torch26-root")
    counts = [int(n) for n in args.ranks.split(",") if n]
    results = {}
    load_before = load_average()
    started = time.monotonic()
    for n in counts:
        for _ in range(args.reps):
            for s in servers:
                # A server that failed at a smaller N (or timed out at this one) is not tried further.
                if any(r.get("rc") != 0 for m in counts if m <= n for r in results.get((s, m), [])):
                    continue
                r = one(args, s, n)
                results.setdefault((s, n), []).append(r)
                print(f"  {s:14} {n:6} ranks  " + (f"{r['total_s']:.2f} s, server CPU {r['server_cpu_s']:.2f} s"
                      if r.get("rc") == 0 else f"FAILED: {r.get('first_error', '?')}"), file=sys.stderr, flush=True)
    load_after = load_average()
    report(args, servers, counts, results, load_before, load_after, time.monotonic() - started)
    write_json(args.json, {f"{s}/{n}": rs for (s, n), rs in results.items()})
    return 0


def report(args, servers, counts, results, load_before, load_after, elapsed):
    print(f"{machine_line(load_before, load_after)}; measurement took {elapsed:.0f} s. "
          f"Median of {args.reps} runs, each against a fresh server; a run over {args.timeout:.0f} s fails.\n")
    print("| ranks | server | dialect | all ranks through the barrier: median | min–max | ÷ ddprun-store "
          "(same dialect) | server CPU, median | server peak RSS | runs ok |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    base_of = {"modern": "ddprun", "legacy": "ddprun-legacy"}
    for n in counts:
        for s in servers:
            rs = results.get((s, n), [])
            ok = [r for r in rs if r.get("rc") == 0]
            label, dialect = TEXT[s]
            if not ok:
                why = rs[-1].get("first_error", "") if rs else "not run (failed at a smaller N)"
                print(f"| {n} | {label} | {dialect} | — | — | — | — | — | 0 of {len(rs)} ({why[:80]}) |")
                continue
            t = [r["total_s"] for r in ok]
            base = [r["total_s"] for r in results.get((base_of["modern" if "modern" in dialect else "legacy"], n), [])
                    if r.get("rc") == 0]
            ratio = f"{statistics.median(t) / statistics.median(base):.1f}×" if base else "—"
            print(f"| {n} | {label} | {dialect} | {statistics.median(t):.2f} s | {min(t):.2f}–{max(t):.2f} s | "
                  f"{ratio} | {statistics.median(r['server_cpu_s'] for r in ok):.2f} s | "
                  f"{max(r['server_hwm_kb'] for r in ok) / 1024:.0f} MB | {len(ok)} of {len(rs)} |")


if __name__ == "__main__":
    sys.exit(main())
