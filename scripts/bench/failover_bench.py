"""Store-host failover benchmark: a 3-host DDP job loses the host that serves its rendezvous store.

Run by scripts/bench-failover.sh; standard library only (the torch Pythons only run the launchers and the
workers). Hosts are the network namespaces of scripts/test-cluster.sh (ddprun-h1..h3, 10.99.0.1..3, taken
under /tmp/ddprun-test-cluster.lock as the tests take them). Every configuration runs one agent per host,
`--nnodes 2:3 --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint 10.99.0.1:PORT --max_restarts 3
--rdzv_conf last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=60` (heartbeat
timeout 3 s; torchrun ignores the keys it does not know), over scripts/examples/ddp_train.py (gloo DDP on CPUs,
a checkpoint every 10 steps, --stamp). Once all 6 ranks trained and a checkpoint exists, every process of
host 1 (its agent, which hosts the store, and its workers) is SIGKILLed. Per run:
  running    the kill -> the last of the 4 survivors' workers started again ('start' stamp, before `import torch`)
  training   the kill -> the last of them completed its first step again ('first-step' stamp)
  outcome    ddprun: "resumed" once all 4 trained again (then the run is stopped); torchrun: the survivors'
             exit codes and when they exited ("the job dies"), or "still running" after --cap seconds.

Configurations (--configs): ddprun-1.13, ddprun-2.6 (workers `--python` torch 1.13 / scripts/torch26-python),
torchrun-1.13 (`/usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1`: Debian's torch 1.13 needs
them), torchrun-2.6 (scripts/torch26-python -m torch.distributed.run).

Exit codes: 0 done (runs that did not recover show in the table), 1 the hosts cannot be made, 2 bad arguments.
"""

import argparse
import fcntl
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_harness import (add_job_args, chosen_configs, kill_netns_host, netns_host_pids, parse_stamps,
                           write_json)

CONFIGS = {"ddprun-1.13": ("ddprun", "1.13"), "ddprun-2.6": ("ddprun", "2.6"),
           "torchrun-1.13": ("torchrun 1.13", "1.13"), "torchrun-2.6": ("torchrun 2.6", "2.6")}
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=60"
NPROC, HOSTS, LOCK = 2, 3, "/tmp/ddprun-test-cluster.lock"
HOSTS_MARK = "# ddprun-bench-failover"


def set_host_names(present):
    """Adds (or removes) /etc/hosts lines for ddprun-h1..h3: torchrun resolves its own host name (torch 1.13
    crashes when it cannot) and gives it to the workers as MASTER_ADDR."""
    with open("/etc/hosts") as f:
        kept = [line for line in f.read().splitlines() if not line.endswith(HOSTS_MARK)]
    if present:
        kept += [f"10.99.0.{h} ddprun-h{h} {HOSTS_MARK}" for h in range(1, HOSTS + 1)]
    with open("/etc/hosts", "w") as f:
        f.write("\n".join(kept) + "\n")


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def command(args, name, host, port, run_id, tmp):
    launcher, torch = CONFIGS[name]
    python = args.python if torch == "1.13" else args.torch26_python
    common = ["--nnodes", "2:3", "--nproc_per_node", str(NPROC), "--rdzv_backend", "c10d", "--rdzv_endpoint",
              f"10.99.0.1:{port}", "--rdzv_id", run_id, "--rdzv_conf", RDZV_CONF, "--max_restarts", "3"]
    train = [args.train, "--steps", "1000000", "--hidden", "32", "--batch", "16", "--log-every", "1000",
             "--save-every", "10", "--checkpoint", os.path.join(tmp, "checkpoint.pt"), "--stamp",
             os.path.join(tmp, "stamps")]
    if launcher == "ddprun":
        return [args.ddprun, *common, "--python", python, *train]
    # torchrun's own guess of is_host resolves names the hosts do not have: say it (ddprun guesses right).
    common[common.index(RDZV_CONF)] = f"{RDZV_CONF},is_host={int(host == 1)}"
    return [python, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1", *common, *train]


def one_run(args, name, port):
    tmp = tempfile.mkdtemp(prefix="bench-failover-")
    run_id = f"bench-{os.getpid()}-{port}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0")
    agents = {}
    for host in range(1, HOSTS + 1):
        log = open(os.path.join(tmp, f"agent-h{host}.log"), "wb")
        agents[host] = subprocess.Popen(["bash", args.cluster, "exec", str(host),
                                         *command(args, name, host, port, run_id, tmp)],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
    stamps = os.path.join(tmp, "stamps")
    result = {"config": name}
    try:
        ready = wait_for(lambda: len(parse_stamps(stamps).get(("first-step", 0), {})) == HOSTS * NPROC and
                         os.path.exists(os.path.join(tmp, "checkpoint.pt")), 180)
        if not ready:
            result["outcome"] = "did not start"
            return result
        time.sleep(1)
        killed_at = time.time_ns()
        kill_netns_host(1)

        def after(event):
            return [ns for (e, _), ranks in parse_stamps(stamps).items() if e == event
                    for ns in ranks.values() if ns > killed_at]

        survivors = [agents[2], agents[3]]
        recovered = wait_for(lambda: len(after("first-step")) >= (HOSTS - 1) * NPROC or
                             all(a.poll() is not None for a in survivors), args.cap)
        exits = [a.poll() for a in survivors]
        if len(after("start")) >= (HOSTS - 1) * NPROC:
            result["running_s"] = (sorted(after("start"))[(HOSTS - 1) * NPROC - 1] - killed_at) / 1e9
        if recovered and len(after("first-step")) >= (HOSTS - 1) * NPROC:
            result["training_s"] = (sorted(after("first-step"))[(HOSTS - 1) * NPROC - 1] - killed_at) / 1e9
            result["outcome"] = "resumed"
        elif all(e is not None for e in exits):
            result["outcome"] = f"the job dies: survivors exit {exits[0]}, {exits[1]}"
            result["died_s"] = (time.time_ns() - killed_at) / 1e9
        else:
            result["outcome"] = f"still running after {args.cap} s, not training"
        return result
    finally:
        for host in range(1, HOSTS + 1):
            kill_netns_host(host)
        for a in agents.values():
            try:
                a.wait(timeout=30)
            except subprocess.TimeoutExpired:
                a.kill()
        wait_for(lambda: not any(netns_host_pids(h) for h in range(1, HOSTS + 1)), 30)
        result["logs"] = tmp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_args(ap, "scripts/torch26-root.sh")
    ap.add_argument("--cluster", required=True, help="scripts/test-cluster.sh")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cap", type=float, default=90, help="seconds to wait after the kill")
    ap.add_argument("--json")
    args = ap.parse_args()
    names = chosen_configs(ap, args, CONFIGS)
    lock = open(LOCK, "a+")
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.write(f"pid {os.getpid()} (bench-failover)\n")
    lock.flush()
    up = subprocess.run(["bash", args.cluster, "down"], capture_output=True, text=True)
    up = subprocess.run(["bash", args.cluster, "up", str(HOSTS)], capture_output=True, text=True)
    if up.returncode != 0:
        print(f"bench-failover: test-cluster.sh up {HOSTS} failed:\n{up.stdout}{up.stderr}", file=sys.stderr)
        return 1
    load_before = os.getloadavg()[0]
    results = []
    set_host_names(True)
    try:
        port = 29700
        for rep in range(args.reps):
            for name in names:
                port += 1
                print(f"bench-failover: {name} run {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
                r = one_run(args, name, port)
                print(f"bench-failover:   {r}", file=sys.stderr, flush=True)
                results.append(r)
    finally:
        set_host_names(False)
        subprocess.run(["bash", args.cluster, "down"], capture_output=True)
        lock.close()
    write_json(args.json, {"results": results, "load_before": load_before, "load_after": os.getloadavg()[0]})

    def span(xs):
        if not xs:
            return "—"
        return f"{statistics.median(xs):.2f} s ({min(xs):.2f}–{max(xs):.2f})" if len(xs) > 1 else f"{xs[0]:.2f} s"

    print(f"Store host (host 1 of 3) SIGKILLed mid-training; heartbeat timeout 3 s; {args.reps} runs each; "
          f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after.\n")
    print("| launcher | torch | workers running again | training again | outcome |")
    print("|---|---|---:|---:|---|")
    for name in names:
        rs = [r for r in results if r["config"] == name]
        outcomes = sorted({r["outcome"] for r in rs})
        print(f"| {CONFIGS[name][0]} | {CONFIGS[name][1]} | {span([r['running_s'] for r in rs if 'running_s' in r])}"
              f" | {span([r['training_s'] for r in rs if 'training_s' in r])} | {'; '.join(outcomes)}"
              + (f" (after {span([r['died_s'] for r in rs if 'died_s' in r])})" if any('died_s' in r for r in rs)
                 else "") + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
