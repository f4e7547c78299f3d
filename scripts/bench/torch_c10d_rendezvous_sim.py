#!/usr/bin/python3
"""N simulated nodes run torch's own elastic rendezvous (c10d backend; torch 1.13 or 2.x) against one TCPStore.

    /usr/bin/python3 scripts/bench/torch_c10d_rendezvous_sim.py --nodes N [--store torch|ddprun]
                     [--ddprun-store PATH | --store-port PORT] [--in PYTHON] [--timeout S]

The counterpart of ddprun-rendezvous-sim, for scripts/bench-rendezvous.sh. A benchmark, not a test.

What it does, in order:
  1. starts the store: --store torch hosts torch's own TCPStore server in this process (a master TCPStore,
     whose server is a C++ thread); --store ddprun starts PATH (ddprun-store --port 0), wire compatible, or
     with --store-port uses a ddprun-store already listening on 127.0.0.1:PORT;
  2. builds N nodes on the main thread (not timed): each a TCPStore client of its own, a
     C10dRendezvousBackend(store, run_id) and DynamicRendezvousHandler.from_backend(...) with
     min_nodes = max_nodes = N, exactly what torchrun's c10d backend builds per agent;
  3. starts one thread per node, parked on a barrier; when all are parked, releases them; each calls
     next_rendezvous() and stamps time.monotonic() before and after;
  4. verifies: ranks 0..N-1 each exactly once, world size N for every node;
  5. prints one JSON line: wall_ms = last return - first call, phases like the C++ simulation, the torch
     version, and for --store ddprun the requests the store served in the whole run (setup included: each
     node's client ADDs "init/" once and its backend does one COMPARE_SET; ddprun-store logs the count when
     stopped; not known with --store-port).

--in PYTHON (e.g. scripts/torch26-python, torch 2.6 in a Debian 13 root): this process only starts and stops
the ddprun-store (so that the store runs with this machine's libraries, not the root's) and runs the
simulation itself as `PYTHON <this script> ... --store-port PORT`; it prints the child's JSON line with the
store's request count added. With --store torch, the child hosts torch's server itself.

Versions: torch 2.x's next_rendezvous returns a RendezvousInfo (1.13: a tuple), and with the default
TCPStore sharing (TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset) its rank-0 node also starts a TCPStore server
of its own and every node reads its address from the store (2 more requests per node): torchrun 2.x does the
same, so it is measured as part of the round.

Timeouts (RendezvousTimeout; torch requires each to be positive): join = --timeout, last_call = 1 ms,
close = 30 s, heartbeat = 5 s. With min_nodes = max_nodes the round completes when the N-th node joins
(torch marks it complete at once), so the last call never applies; keep-alive interval 5 s (torch's fixed
value in from_backend). Torch's own protocol waits: a node first sleeps a random 0-0.3 s (round 0), and a
node that must wait polls the state every 1 s; both are part of what is measured.

Exit codes: 0 round complete and verified; 1 a node failed or timed out, or the check failed (the JSON line
says why); 2 torch missing (or --in PYTHON printed no JSON line).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

from bench_harness import print_round, rendezvous_round, round_verdict, start_ddprun_store


def import_torch():
    """The torch modules the simulation needs; exits 2 when this Python has no torch."""
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler,
            RendezvousTimeout,
        )
    except ImportError as exc:  # plain python3 on PATH may be a Python without torch
        print(f"torch_c10d_rendezvous_sim: {exc}; run it with /usr/bin/python3", file=sys.stderr)
        sys.exit(2)
    return torch, dist, C10dRendezvousBackend, DynamicRendezvousHandler, RendezvousTimeout


def stop_ddprun_store(proc, out, nodes):
    """Stops ddprun-store with SIGTERM; adds to out the requests it says it served (requests_total, and
    requests_per_node_incl_setup over nodes) when it says."""
    proc.send_signal(signal.SIGTERM)
    try:
        log, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
    m = re.search(r"(\d+) requests served", log or "")
    if m:
        out["requests_total"] = int(m.group(1))
        out["requests_per_node_incl_setup"] = int(m.group(1)) / nodes


def delegate(args, proc_holder):
    """--in PYTHON: runs the simulation as a child in PYTHON (the store, if ddprun's, here); never returns."""
    child = [args.in_python, os.path.abspath(__file__), "--nodes", str(args.nodes), "--store", args.store,
             "--timeout", str(args.timeout)]
    proc = None
    if args.store == "ddprun":
        if args.store_port is not None:
            child += ["--store-port", str(args.store_port)]
        else:
            proc, port = start_ddprun_store(args.ddprun_store, "info", subprocess.STDOUT)
            proc_holder.append(proc)
            child += ["--store-port", str(port)]
    try:
        res = subprocess.run(child, stdout=subprocess.PIPE, text=True, timeout=args.timeout + 90)
        lines = res.stdout.strip().splitlines()
    except subprocess.TimeoutExpired:
        lines = []
    line = lines[-1] if lines else ""
    if not line.startswith("{"):
        print_round({"nodes": args.nodes, "store": args.store}, f"{args.in_python} printed no result")
        sys.exit(2)
    out = json.loads(line)
    if proc is not None:
        stop_ddprun_store(proc, out, args.nodes)
    print(json.dumps(out), flush=True)
    sys.exit(0 if out.get("ok") else 1)


def main():
    proc_holder = []  # a ddprun-store we started: killed on every way out
    try:
        run(proc_holder)
    finally:
        for p in proc_holder:
            if p.poll() is None:
                p.kill()
                p.wait()


def run(proc_holder):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--store", choices=["torch", "ddprun"], default="torch")
    ap.add_argument("--ddprun-store", help="the ddprun-store program (with --store ddprun)")
    ap.add_argument("--store-port", type=int,
                    help="with --store ddprun: a ddprun-store already listening on 127.0.0.1:PORT")
    ap.add_argument("--in", dest="in_python", metavar="PYTHON",
                    help="run the simulation in this Python (this process only runs the ddprun-store)")
    ap.add_argument("--timeout", type=float, default=300.0, help="join timeout and overall deadline, s")
    args = ap.parse_args()
    if args.store == "ddprun" and not args.ddprun_store and args.store_port is None:
        ap.error("--store ddprun needs --ddprun-store PATH or --store-port PORT")
    if args.in_python:
        delegate(args, proc_holder)
    torch, dist, C10dRendezvousBackend, DynamicRendezvousHandler, RendezvousTimeout = import_torch()
    n = args.nodes

    server, proc = None, None
    if args.store == "torch":
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        port = server.port
    elif args.store_port is not None:
        port = args.store_port
    else:
        proc, port = start_ddprun_store(args.ddprun_store, "info", subprocess.STDOUT)
        proc_holder.append(proc)

    run_id = "sim"
    timeout = RendezvousTimeout(join=timedelta(seconds=args.timeout), last_call=timedelta(milliseconds=1),
                                close=timedelta(seconds=30), heartbeat=timedelta(seconds=5))
    out = {"nodes": n, "store": args.store, "min_nodes": n, "max_nodes": n, "last_call_ms": 1,
           "torch": torch.__version__}
    handlers = []
    setup_start = time.monotonic()
    for _ in range(n):
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        backend = C10dRendezvousBackend(store, run_id)
        # timeout by keyword: torch 2.x inserted local_addr before it
        handlers.append(DynamicRendezvousHandler.from_backend(run_id, store, backend, n, n, timeout=timeout))
    out["setup_ms"] = (time.monotonic() - setup_start) * 1e3

    results = rendezvous_round(handlers, args.timeout)
    for h in handlers:
        h._stop_heartbeats()  # no public way to stop them without closing the rendezvous

    error = round_verdict(results, out)
    if proc is not None:
        stop_ddprun_store(proc, out, n)
    print_round(out, error)
    os._exit(0 if error is None else 1)  # skip tearing down N clients and their threads


if __name__ == "__main__":
    main()
