#!/usr/bin/env python3
"""Multi-node recovery: ddprun against torchrun 2.6 on network-namespace hosts (scripts/test-cluster.sh), one run.

Each run is a real gloo DDP job (scripts/examples/ddp_train.py, 2 ranks per host, c10d rendezvous with the default
timeouts, the store on host 1) on 3 hosts; hosts share the file system, so every rank stamps into one file
(--stamp: 'crash' just before a crash, 'first-step' after each process's first optimizer step). Cases:
  crash   rank 3 (host 2) exits 1 at step 30 of the first attempt (--nnodes 3, or the elastic range 2:3);
          t0 = its 'crash' stamp
  spare   a 4th host waits as a spare (--nnodes 3); host 2's agent is SIGKILLed (its workers die with it);
          t0 = the kill
Recovery = from t0 to the last of the 6 ranks' first completed step after t0 (all 6 training again); a run that
does not get there within --timeout counts as not recovered. Median of --reps runs per configuration, in an
interleaved order. Needs root and network namespaces. Standard library only.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_harness import end_netns_job, load_average, machine_line, poll_until as wait_for  # noqa: E402

NPROC = 2
HOSTS = 3

CONFIGS = {
    # name: (case, nnodes, launcher, torch)
    "crash-3-ddprun-prestart-1.13": ("crash", "3", "ddprun-prestart", "1.13"),
    "crash-3-ddprun-1.13": ("crash", "3", "ddprun", "1.13"),
    "crash-3-ddprun-prestart-2.6": ("crash", "3", "ddprun-prestart", "2.6"),
    "crash-3-ddprun-2.6": ("crash", "3", "ddprun", "2.6"),
    "crash-3-torchrun-2.6": ("crash", "3", "torchrun", "2.6"),
    "crash-2:3-ddprun-prestart-1.13": ("crash", "2:3", "ddprun-prestart", "1.13"),
    "spare-ddprun-prestart-1.13": ("spare", "3", "ddprun-prestart", "1.13"),
    "spare-ddprun-prestart-2.6": ("spare", "3", "ddprun-prestart", "2.6"),
    "spare-torchrun-2.6": ("spare", "3", "torchrun", "2.6"),
}


def events_after(stamp, t0, event="first-step"):
    """{rank: first `event` ns after t0} ('start': the script began, before torch is imported)."""
    seen = {}
    try:
        lines = open(stamp).read().splitlines()
    except OSError:
        return seen
    for line in lines:
        parts = line.split()
        if len(parts) == 4 and parts[0] == event and int(parts[3]) > t0:
            seen.setdefault(int(parts[2]), int(parts[3]))
    return seen


def crash_time(stamp):
    try:
        for line in open(stamp).read().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "crash":
                return int(parts[3])
    except OSError:
        pass
    return None


def run_one(args, name, work, port):
    case, nnodes, launcher, torch = CONFIGS[name]
    d = tempfile.mkdtemp(prefix="run-", dir=work)
    stamp = os.path.join(d, "stamp")
    python = args.python if torch == "1.13" else args.torch26_python
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    endpoint = f"10.99.0.1:{port}"
    common = ["--nnodes", nnodes, "--nproc_per_node", str(NPROC), "--rdzv_backend", "c10d", "--rdzv_endpoint",
              endpoint, "--rdzv_id", run_id, "--max_restarts", "3"]
    train = [args.train, "--steps", "100000", "--hidden", "32", "--batch", "16", "--log-every", "1000",
             "--step-sleep", "0.02", "--stamp", stamp, "--stop-file", os.path.join(d, "stop")]
    if case == "crash":
        train += ["--fail-rank", "3", "--fail-step", "30", "--fail-until-attempt", "1"]
    if launcher == "torchrun":
        argv = [args.torch26_root, "run", "/usr/bin/torchrun"] + common + train
    else:
        argv = [args.ddprun] + common + (["--prestart"] if launcher == "ddprun-prestart" else []) + \
            ["--python", python] + train
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    procs = {}

    def start(host):
        log = open(os.path.join(d, f"agent-h{host}.log"), "wb")
        # torchrun resolves the machine's name to decide whether it hosts the store and to name the workers'
        # MASTER_ADDR, which the hosts' names do not allow inside the torch 2.6 root: tell it both (ddprun
        # finds its addresses itself).
        own = (["--rdzv_conf", f"is_host={int(host == 1)}", "--local_addr", f"10.99.0.{host}"]
               if launcher == "torchrun" else [])
        procs[host] = subprocess.Popen(["bash", args.cluster, "exec", str(host), *argv[:-len(train)], *own,
                                        *train], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True)

    load = load_average()[0]
    result = {"recovered": False, "load1": float(load)}
    try:
        for h in range(1, HOSTS + 1):
            start(h)
        if not wait_for(lambda: len(events_after(stamp, 0)) == HOSTS * NPROC, args.timeout):
            result["error"] = "the job did not start training"
            with open(os.path.join(d, "agent-h1.log"), errors="replace") as f:
                print("  --- host 1's launcher, last lines:\n" + "".join(f.readlines()[-8:]), file=sys.stderr)
            return result
        if case == "spare":
            start(HOSTS + 1)
            time.sleep(args.spare_settle)  # the spare reaches the store and waits (and pre-starts, if it does)
            t0 = time.time_ns()
            os.kill(procs[2].pid, signal.SIGKILL)
        else:
            t0 = wait_for(lambda: crash_time(stamp), args.timeout)
            if not t0:
                result["error"] = "no crash"
                return result
        done = wait_for(lambda: (lambda s: s if len(s) == HOSTS * NPROC else None)(events_after(stamp, t0)),
                        args.timeout)
        if done:
            result["recovered"] = True
            result["recovery_ms"] = (max(done.values()) - t0) / 1e6
            # The launchers' part: until every worker of the next attempt runs its script (a pre-started one:
            # until it is released); the rest is the workers' own start-up (import torch, init_process_group).
            starts = events_after(stamp, t0, "start")
            if len(starts) == HOSTS * NPROC:
                result["launcher_ms"] = (max(starts.values()) - t0) / 1e6
        return result
    finally:
        open(os.path.join(d, "stop"), "w").close()
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        end_netns_job(procs, range(1, HOSTS + 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--cluster", required=True, help="scripts/test-cluster.sh")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--torch26-python", default="")
    ap.add_argument("--torch26-root", default="")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=90)
    ap.add_argument("--spare-settle", type=float, default=5)
    args = ap.parse_args()
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    if not args.torch26_root:
        names = [n for n in names if CONFIGS[n][3] != "2.6"]
    results = {n: [] for n in names}
    load_before = load_average()
    port = 29500
    with tempfile.TemporaryDirectory(prefix="bench-multinode-") as work:
        for _ in range(args.reps):
            for name in names:
                port += 1
                r = run_one(args, name, work, port)
                results[name].append(r)
                what = f"{r['recovery_ms']:.0f} ms" if r["recovered"] else f"NOT RECOVERED ({r.get('error', '')})"
                print(f"  {name:32} load {r['load1']:.2f}  {what}", file=sys.stderr, flush=True)
    load_after = load_average()
    print(f"Multi-node recovery, {HOSTS} network-namespace hosts x {NPROC} gloo ranks, c10d, default timeouts; "
          f"{args.reps} runs each. {machine_line(load_before, load_after)}\n")
    print("| case | --nnodes | launcher | workers' torch | recovered | median | min | max | of which the launcher "
          "(median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        case, nnodes, launcher, torch = CONFIGS[name]
        runs = results[name]
        ok = [r["recovery_ms"] / 1000 for r in runs if r["recovered"]]
        cells = [f"{statistics.median(ok):.2f} s", f"{min(ok):.2f} s", f"{max(ok):.2f} s"] if ok else ["—"] * 3
        launched = [r["launcher_ms"] / 1000 for r in runs if "launcher_ms" in r]
        cells.append(f"{statistics.median(launched):.2f} s" if launched else "—")
        what = "worker crash" if case == "crash" else "spare replaces a SIGKILLed node"
        print(f"| {what} | {nnodes} | {launcher} | {torch} | {len(ok)}/{len(runs)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
