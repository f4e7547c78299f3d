#!/usr/bin/python3
"""N simulated nodes run torch's own elastic rendezvous over etcd (backend etcd or etcd-v2; torch 1.13 or 2.x).

    /usr/bin/python3 scripts/bench/torch_etcd_rendezvous_sim.py --backend etcd|etcd-v2 --nodes N
                     --endpoints HOST:PORT[,HOST:PORT...] [--run-id X] [--timeout S]

The counterpart of ddprun-etcd-rendezvous-sim, for scripts/bench-etcd-rendezvous.sh. A benchmark, not a test.
Needs python-etcd (Debian's python3-etcd), which torch's etcd backends import.

What it does, in order:
  1. builds N handlers on the main thread (not timed; setup_ms), each through torch's own handler registry
     (torch.distributed.elastic.rendezvous.registry.get_rendezvous_handler), from the RendezvousParameters
     torchrun makes of --rdzv_backend, --rdzv_endpoint, --rdzv_id and --nnodes N:N: `etcd` an
     EtcdRendezvousHandler (its constructor creates the run's directories), `etcd-v2` a
     DynamicRendezvousHandler over EtcdRendezvousBackend with an EtcdStore. Each has its own etcd.Client.
     torch's etcd client talks to one member only (its endpoint is one host:port), so node i is given member
     i % M: the nodes spread over the cluster as ddprun-etcd-rendezvous-sim's do;
  2. starts one thread per node, parked on a barrier; when all are parked, releases them; each calls
     next_rendezvous() and stamps time.monotonic() before and after;
  3. verifies: ranks 0..N-1 each exactly once, world size N for every node;
  4. prints one JSON line: wall_ms = last return - first call, phases as the C++ simulation's, the torch
     version.

Timeouts: join (etcd: timeout) = --timeout, last_call 1 s (torch's parameters are whole seconds; with
min = max = N the round closes at the N-th arrival, so it never applies), close 30 s. Torch's own protocol
waits are part of what is measured: etcd-v2 (DynamicRendezvousHandler) sleeps a random 0-0.3 s before
round 0 and polls the state every 1 s while it waits; the legacy etcd handler watches active_version and
retries a failed compare-and-swap after a random 0-0.1 s.

Versions: torch 2.x's next_rendezvous returns a RendezvousInfo (1.13: a tuple); 2.x's registry also takes
local_addr (not given here: None, as torchrun without --local_addr).

Exit codes: 0 round complete and verified; 1 a node failed or timed out, or the check failed (the JSON line
says why); 2 torch or python-etcd missing (the JSON line says which).
"""
import argparse
import os
import sys
import time

from bench_harness import print_round, rendezvous_round, round_verdict


def import_torch(out):
    """torch and the registry function; prints a failed JSON line and exits 2 when either is missing."""
    try:
        import etcd  # noqa: F401 - torch's etcd backends import it lazily; fail here, not in a node
        import torch
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    except ImportError as exc:
        print_round(out, f"{type(exc).__name__}: {exc}")
        sys.exit(2)
    return torch, RendezvousParameters, get_rendezvous_handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["etcd", "etcd-v2"], default="etcd-v2")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--endpoints", required=True, help="etcd members, HOST:PORT[,HOST:PORT...]")
    ap.add_argument("--run-id", default="sim")
    ap.add_argument("--timeout", type=int, default=120, help="join timeout, whole seconds")
    args = ap.parse_args()
    n = args.nodes
    members = args.endpoints.split(",")
    out = {"backend": args.backend, "nodes": n, "min_nodes": n, "max_nodes": n, "members": len(members),
           "run_id": args.run_id}
    torch, RendezvousParameters, get_rendezvous_handler = import_torch(out)
    out["torch"] = torch.__version__

    handlers = []
    setup_start = time.monotonic()
    try:
        for i in range(n):
            params = RendezvousParameters(backend=args.backend, endpoint=members[i % len(members)],
                                          run_id=args.run_id, min_nodes=n, max_nodes=n,
                                          timeout=args.timeout, join_timeout=args.timeout,
                                          last_call_timeout=1, close_timeout=30)
            handlers.append(get_rendezvous_handler(params))
    except Exception as exc:  # noqa: BLE001 - reported, not handled
        print_round(out, f"setup: {type(exc).__name__}: {exc}")
        os._exit(1)
    out["setup_ms"] = (time.monotonic() - setup_start) * 1e3

    results = rendezvous_round(handlers, args.timeout)
    error = round_verdict(results, out)
    print_round(out, error)
    os._exit(0 if error is None else 1)  # skip stopping N keep-alive threads and clients


if __name__ == "__main__":
    main()
