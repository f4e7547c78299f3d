#!/usr/bin/env python3
"""Training state across nodes (issue 46, docs/state.md "Between agents"), on network-namespace hosts
(scripts/test-cluster.sh, host set 0): 2 nodes of one rank each and a hot spare, c10d rendezvous, the store on
host 1, `--state_memory 6×SIZE+64M`; the worker is scripts/bench/state_spare_worker.py (SIZE MiB of state per
rank, saved twice synchronously, then idle). One run per SIZE and --state_bandwidth value:
  copy       each agent's copy of its rank's newest version (step 2) to its buddy, from the agent's log
             ("copied to node N ... in X ms", --log_level debug): with a cap, this is the cap end to end
  kill       host 2 is SIGKILLed (agent and worker) once both copies arrived; the spare takes its node rank
  fetch      the spare's agent restores the lost rank's versions from the buddy before its workers start
             ("restored rank R's state (...) in D", from its log)
  load       the spare's worker: ddprun.state.load() (the agreement with the other rank included) and a read
             of every page, and whether the bytes are those rank saved
  kill→load  from the kill to that load's end: failure detection, the new round, the fetch, the workers'
             start (import torch), the load
Prints a Markdown table. Needs root. Standard library only.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_harness import end_netns_job, kill_netns_host, load_average, machine_line, poll_until  # noqa: E402

RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=120"
COPIED = re.compile(r"rank (\d+)'s step 2 \(([\d.]+ \w+)\) copied to node \d+ at \S+ in (\d+) ms")
RESTORED = re.compile(r"restored rank (\d+)'s state \(newest step (\d+), (\d+) version\(s\), ([\d.]+ \w+)\) from the "
                      r"agent at \S+ in ([\d.]+) (ms|s)\b")


def wait_for(pred, timeout, what):
    v = poll_until(pred, timeout)
    if not v:
        raise TimeoutError(f"no {what} within {timeout} s")
    return v


def text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def run_one(args, size, bandwidth, port):
    d = tempfile.mkdtemp(prefix=f"state-spare-{size}-", dir=args.work)
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    argv = [args.ddprun, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
            f"10.99.0.1:{port}", "--rdzv_id", run_id, "--rdzv_conf", RDZV_CONF, "--max_restarts", "3",
            "--state_memory", f"{6 * size + 64}M", "--log_level", "debug", "--python", args.python]
    if bandwidth != "0":
        argv += ["--state_bandwidth", bandwidth]
    argv += [args.worker, str(size), d]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    procs, logs = {}, {}

    def start(host):
        logs[host] = os.path.join(d, f"agent-h{host}.log")
        procs[host] = subprocess.Popen(["bash", args.cluster, "exec", str(host), *argv], stdin=subprocess.DEVNULL,
                                       stdout=open(logs[host], "wb"), stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)

    result = {"size": size, "bandwidth": bandwidth, "load1": load_average()[0]}
    try:
        start(1)
        start(2)
        wait_for(lambda: all(os.path.exists(os.path.join(d, f"saved.rank{r}")) for r in (0, 1)), args.timeout,
                 "saves of both ranks")
        copies = wait_for(lambda: (lambda c: c if len(c) == 2 else None)(
            {int(m[1]): int(m[3]) for h in (1, 2) for m in COPIED.finditer(text(logs[h]))}), args.timeout,
            "copies of both ranks' step 2 to their buddies (--log_level debug)")
        result["copy_ms"] = sorted(copies.values())
        start(3)
        time.sleep(args.spare_settle)  # the spare reaches the store and waits
        t_kill = time.time()
        kill_netns_host(2)
        restored = wait_for(lambda: RESTORED.search(text(logs[3])), args.timeout, "restore on the spare")

        def spare_report():  # the restored rank's first load after the kill
            for path in glob.glob(os.path.join(d, f"rank{restored[1]}.*.json")):
                with open(path) as f:
                    r = json.load(f)
                if r["step"] is not None and r["finished"] > t_kill:
                    return r
            return None

        r = wait_for(spare_report, args.timeout, "load on the spare")
        m = restored
        result.update(fetch_ms=float(m[5]) * (1000 if m[6] == "s" else 1), versions=int(m[3]), fetched=m[4],
                      load_ms=r["restore_s"] * 1000, step=r["step"], identical=r["identical"],
                      kill_to_loaded_ms=(r["finished"] - t_kill) * 1000)
        return result
    except TimeoutError as e:
        result["error"] = str(e)
        for h, path in logs.items():
            print(f"  --- host {h}'s agent, last lines:\n" + "".join(text(path).splitlines(True)[-10:]),
                  file=sys.stderr)
        return result
    finally:
        open(os.path.join(d, "stop"), "w").close()
        end_netns_job(procs, (1, 2, 3))
        for p in procs.values():  # a killed host's state guard died with it; the hosts share /dev/shm
            shutil.rmtree(f"/dev/shm/ddprun-state-{p.pid}", ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--cluster", required=True, help="scripts/test-cluster.sh (hosts 1-3 up)")
    ap.add_argument("--python", required=True, help="a python with torch")
    ap.add_argument("--worker", required=True, help="scripts/bench/state_spare_worker.py")
    ap.add_argument("--sizes", default="256 1024", help="MiB of state per rank")
    ap.add_argument("--bandwidths", default="0", help="--state_bandwidth values (0: no cap)")
    ap.add_argument("--work", default=tempfile.gettempdir())
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--spare-settle", type=float, default=3)
    args = ap.parse_args()
    before = load_average()
    rows = []
    for i, size in enumerate(int(s) for s in args.sizes.split()):
        for j, bandwidth in enumerate(args.bandwidths.split()):
            print(f"state-spare: {size} MiB, --state_bandwidth {bandwidth}", file=sys.stderr)
            rows.append(run_one(args, size, bandwidth, 29600 + 10 * i + j))
    print("| state per rank | --state_bandwidth | copy to the buddy (each rank) | spare: fetch from the buddy "
          "| spare: load + read | kill → loaded on the spare | bytes identical |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['size']} MiB | {r['bandwidth']} | {r.get('copy_ms', '-')} | failed: {r['error']} | | | |")
            continue
        print(f"| {r['size']} MiB | {r['bandwidth'] if r['bandwidth'] != '0' else 'no cap'} "
              f"| {' / '.join(f'{ms} ms' for ms in r['copy_ms'])} | {r['fetch_ms']:.0f} ms ({r['versions']} "
              f"version{'s' if r['versions'] != 1 else ''}, {r['fetched']}) | {r['load_ms']:.0f} ms | {r['kill_to_loaded_ms']:.0f} ms "
              f"| {r['identical']} |")
    print(f"\n{machine_line(before, load_average())}.")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
