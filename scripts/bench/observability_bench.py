"""Observability cost: what ddprun's status publishing and /metrics cost a training job, and how fast
`ddprun status` answers for a 1,000-node job.

Run by scripts/bench-observability.sh with a Python that has torch 1.13 (the launchers and the workers use
it; part 3 uses its TCPStore as the store client).

1. Agent CPU. A real 2-node job on loopback, two agents with `--nnodes 2 --nproc_per_node 2 --node_rank 0|1
   --master_addr 127.0.0.1 --master_port P --max_restarts 0 --redirects 1 --tee 1` (Debian's torch 1.13.1
   torchrun crashes at its start without the last two), over scripts/examples/ddp_train.py (gloo on CPUs,
   batch 16, --step-sleep 0.1: the idle CPU of a GPU step). Once every rank has completed its first step
   (--stamp), the job trains for --train-s seconds and is then stopped through --stop-file. Variants, run
   alternately, --reps times each:
     ddprun          ddprun as it is: its status document is published every 2 s, always
     ddprun-metrics  ddprun --metrics_port on each agent, both scraped (GET /metrics) every second
     torchrun        torch's torchrun (`PYTHON -m torch.distributed.run`), its defaults otherwise
   An agent's CPU is utime + stime of the agent process itself (not its workers) from /proc/<pid>/stat,
   read every 0.2 s and once more when it has exited but is not reaped yet (waitid WNOWAIT), so the last
   value is its total. Whole run: that total over the agent's wall time (spawn -> exit). Steady: the CPU
   spent from 25 % to 75 % of the training time (10-30 s of 40 s) over that time.
2. Store requests (ddprun-metrics only): ddprun_store_requests_total of node 0's agent, which hosts the store
   (summed over its series: with or without an `op` label), at 25 % and 75 % of the training time; the
   difference per second and per node (2). It counts every client's requests, the workers' included.
3. `ddprun status` of a simulated job: ddprun-store on a free loopback port; one client writes what --nodes
   c10d agents with --ranks ranks each publish (rendezvous/round_keys.cc publish_status: the counter
   ddprun/<run>/status/n by add, ddprun/<run>/status/<i> = identity, ddprun/<run>/status/<identity> = the
   document of agent/observe/status_report.h, all in round 0 and running; and ddprun/<run>/live/<identity>,
   the c10d keep-alive key that `status` checks). Then `ddprun status --rdzv_backend c10d --rdzv_endpoint
   127.0.0.1:PORT --rdzv_id RUN`, with --json and without (the table), --status-reps times each, alternately,
   after one untimed call of each, while a second client rewrites documents at --write-rate sets/s (every
   agent once per 2 s). `ddprun --version` is timed as well: the floor of starting the program.
   Every answer is checked (all nodes and ranks there, every node running).

Leftovers: every process carries BENCH_LAUNCHER_TOKEN=<token>; after each run those still alive are counted
(leaked) and SIGKILLed.

Exit codes: 0 done (failed runs show in the tables), 2 bad arguments.
"""

import argparse
import datetime
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from bench_harness import (add_json_arg, add_token_arg, in_work_dir, load_average, machine_line, parse_stamps,
                           print_commands, print_tail, spawn_logged, start_ddprun_store, sweep, write_json)

VARIANTS = {
    "ddprun": ("ddprun", "status published (always on)"),
    "ddprun-metrics": ("ddprun", "status + --metrics_port, scraped every 1 s"),
    "torchrun": ("torchrun", "—"),
}
NODES, NPROC, STEP_SLEEP = 2, 2, 0.1
WINDOW = (0.25, 0.75)  # the steady part of the training, as fractions of --train-s
START_TIMEOUT_S, EXIT_TIMEOUT_S = 150, 60
REQUESTS = "ddprun_store_requests_total"
RUN_ID = "obsbench"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--store", required=True, help="ddprun-store")
    ap.add_argument("--train", required=True, help="scripts/examples/ddp_train.py")
    ap.add_argument("--python", default="/usr/bin/python3", help="Python with torch (workers, torchrun)")
    ap.add_argument("--variants", default="ddprun,ddprun-metrics,torchrun")
    ap.add_argument("--reps", type=int, default=2, help="runs of each variant (0: skip parts 1 and 2)")
    ap.add_argument("--train-s", type=float, default=40, help="seconds each job trains")
    ap.add_argument("--status-reps", type=int, default=10, help="timed `ddprun status` calls per form (0: skip)")
    ap.add_argument("--nodes", type=int, default=1000, help="simulated agents")
    ap.add_argument("--ranks", type=int, default=8, help="ranks per simulated agent")
    ap.add_argument("--write-rate", type=float, default=500, help="documents rewritten per second")
    add_token_arg(ap)
    add_json_arg(ap)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v} (known: {', '.join(VARIANTS)})")
    return in_work_dir("ddprun-bench-observability-", args.token, lambda work: measure(args, variants, work))


def measure(args, variants, work):
    env = dict(os.environ, OMP_NUM_THREADS="1", BENCH_LAUNCHER_TOKEN=args.token)
    load_before = load_average()
    started = time.monotonic()
    runs = {v: [] for v in variants}
    for rep in range(args.reps):
        for v in variants:
            d = os.path.join(work, f"{v}-{rep}")
            run = run_job(args, v, d, env)
            runs[v].append(run)
            print_run(v, run, d)
    commands = {v: display(args, agent_argv(args, v, 0, "MASTER_PORT", "METRICS_PORT", "$TMP/run"))
                for v in variants} if args.reps > 0 else {}
    status = measure_status(args, env) if args.status_reps > 0 else None
    load_after = load_average()
    version = torch_version(args.python)
    report(args, variants, runs, status, commands, version, load_before, load_after, time.monotonic() - started)
    write_json(args.json, {"load_before": load_before, "load_after": load_after, "torch": version,
                           "train_s": args.train_s, "runs": runs, "status": status, "commands": commands})
    return 0


# ---- parts 1 and 2: the training job --------------------------------------------------------------------
def free_ports(n):
    """n distinct free loopback ports (all bound at once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def agent_argv(args, variant, node_rank, master_port, metrics_port, d):
    if variant == "torchrun":
        launcher = [args.python, "-m", "torch.distributed.run"]
    else:
        launcher = [args.ddprun, "--python", args.python]
        if variant == "ddprun-metrics":
            launcher += ["--metrics_port", str(metrics_port)]
    return launcher + [
        "--nnodes", str(NODES), "--nproc_per_node", str(NPROC), "--node_rank", str(node_rank),
        "--master_addr", "127.0.0.1", "--master_port", str(master_port), "--max_restarts", "0",
        "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(d, f"logs{node_rank}"),
        args.train, "--steps", "1000000000", "--batch", "16", "--step-sleep", f"{STEP_SLEEP:g}",
        "--log-every", "1000000000", "--stop-file", os.path.join(d, "stop"), "--stamp", os.path.join(d, "stamp")]


def cpu_seconds(pid):
    """utime + stime of pid itself (not its children), from /proc/<pid>/stat; a zombie keeps its times."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # fields[0] is field 3 (state): utime is 14, stime 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric_series(text, name):
    """{series: value} of the metric `name` in a Prometheus text exposition ({} when absent)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
            series, value = line.rsplit(None, 1)
            out[series] = float(value)
    return out


class Scraper(threading.Thread):
    """GETs /metrics of each port every interval_s; samples[i] is [(monotonic time, {series: value} of
    REQUESTS)] of ports[i], one per answer. Requests that fail (the agent not listening yet) are counted."""

    def __init__(self, ports, interval_s=1.0):
        super().__init__(daemon=True)
        self.ports, self.interval_s = ports, interval_s
        self.samples = [[] for _ in ports]
        self.failed = 0
        self.done = threading.Event()

    def run(self):
        due = time.monotonic()
        while not self.done.wait(max(0.0, due - time.monotonic())):
            due += self.interval_s
            for i, port in enumerate(self.ports):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as reply:
                        text = reply.read().decode()
                except (OSError, http.client.HTTPException):
                    self.failed += 1
                    continue
                self.samples[i].append((time.monotonic(), metric_series(text, REQUESTS)))

    def stop(self):
        self.done.set()
        self.join()


def training_start(stamp):
    """time.monotonic() at which the last rank completed its first step; None before all have."""
    firsts = parse_stamps(stamp).get(("first-step", 0), {})
    if len(firsts) < NODES * NPROC:
        return None
    return max(firsts.values()) / 1e9 - (time.time() - time.monotonic())


def nearest(samples, t):
    return min(samples, key=lambda s: abs(s[0] - t)) if samples else None


def rate(samples, t0, t1, value=lambda s: s[1]):
    """(value at the sample nearest t1 - at the sample nearest t0) per second; None without two samples."""
    a, b = nearest(samples, t0), nearest(samples, t1)
    if a is None or b[0] <= a[0]:
        return None
    return (value(b) - value(a)) / (b[0] - a[0])


def run_job(args, variant, d, env):
    """One run of the 2-node job: both agents to their exit (killed past the time limits)."""
    os.makedirs(d)
    stamp, stop = os.path.join(d, "stamp"), os.path.join(d, "stop")
    master_port, *metrics_ports = free_ports(1 + (NODES if variant == "ddprun-metrics" else 0))
    argvs = [agent_argv(args, variant, r, master_port, metrics_ports[r] if metrics_ports else 0, d)
             for r in range(NODES)]
    load = float(load_average()[0])
    t_spawn = time.monotonic()
    agents = [{"pid": spawn_logged(argv, env, os.path.join(d, f"node{r}.log")), "cpu": [], "end": None, "rc": None}
              for r, argv in enumerate(argvs)]
    scraper = Scraper(metrics_ports) if metrics_ports else None
    if scraper:
        scraper.start()
    start = None
    timed_out = False
    while any(a["end"] is None for a in agents):
        now = time.monotonic()
        for a in agents:
            poll_agent(a, now)
        start = start or training_start(stamp)
        if start is not None and now >= start + args.train_s and not os.path.exists(stop):
            open(stop, "w").close()
        deadline = t_spawn + START_TIMEOUT_S if start is None else start + args.train_s + EXIT_TIMEOUT_S
        if now >= deadline and not timed_out:
            timed_out = True
            for a in agents:
                if a["end"] is None:
                    os.killpg(a["pid"], signal.SIGKILL)
        time.sleep(0.2)
    if scraper:
        scraper.stop()
    leaked = sweep(args.token)
    run = {"load1": load, "timed_out": timed_out, "leaked": len(leaked),
           "trained": start is not None, "agents": []}
    if start is not None:
        run["training_starts_s"] = start - t_spawn
    window = [start + f * args.train_s for f in WINDOW] if start is not None else None
    for r, a in enumerate(agents):
        wall = a["end"] - t_spawn
        cpu = a["cpu"][-1][1] if a["cpu"] else None
        steady = rate(a["cpu"], *window) if window else None
        run["agents"].append({"node_rank": r, "rc": a["rc"], "wall_s": wall, "cpu_s": cpu,
                              "cpu_pct": 100 * cpu / wall if cpu is not None else None,
                              "steady_cpu_pct": 100 * steady if steady is not None else None})
    if scraper:
        run["scrapes_failed"] = scraper.failed
        run["scrapes"] = [len(s) for s in scraper.samples]
        store_host = scraper.samples[0]
        if window and store_host and store_host[-1][1]:
            total = rate(store_host, *window, value=lambda s: sum(s[1].values()))
            run["requests_per_node_s"] = total / NODES if total is not None else None
            a, b = nearest(store_host, window[0]), nearest(store_host, window[1])
            if b[0] > a[0]:
                run["requests_per_s_by_series"] = {k: (v - a[1].get(k, 0)) / (b[0] - a[0])
                                                   for k, v in b[1].items() if v != a[1].get(k, 0)}
    return run


def poll_agent(a, now):
    """Reads the agent's CPU time; once it has exited, reads it from the zombie and reaps it."""
    if a["end"] is not None:
        return
    exited = os.waitid(os.P_PID, a["pid"], os.WEXITED | os.WNOHANG | os.WNOWAIT)
    try:
        a["cpu"].append((now, cpu_seconds(a["pid"])))
    except OSError:
        pass
    if exited:
        a["end"] = now
        _, status = os.waitpid(a["pid"], 0)
        a["rc"] = os.waitstatus_to_exitcode(status)


def run_ok(run):
    return run["trained"] and not run["timed_out"] and all(a["rc"] == 0 for a in run["agents"])


def print_run(variant, run, d):
    cpu = "  ".join(f"node {a['node_rank']} {fmt_pct(a['cpu_pct'])} (steady {fmt_pct(a['steady_cpu_pct'])})"
                    for a in run["agents"])
    extra = ""
    if "requests_per_node_s" in run:
        extra = f"  store {fmt_num(run['requests_per_node_s'])} req/s per node"
    rcs = ",".join(str(a["rc"]) for a in run["agents"])
    print(f"  {variant:15} load {run['load1']:.2f}  rc {rcs}  agent CPU {cpu}{extra}"
          f"{'  TIMED OUT' if run['timed_out'] else ''}{'  leaked ' + str(run['leaked']) if run['leaked'] else ''}",
          file=sys.stderr, flush=True)
    if not run_ok(run):
        for r in range(NODES):
            print_tail(open(os.path.join(d, f"node{r}.log"), errors="replace").read())


def display(args, argv):
    """A command line as the report shows it: the programs by their short names."""
    text = " ".join(argv)
    for path, short in ((args.ddprun, "ddprun"), (args.train, "ddp_train.py"),
                        (f"{args.python} -m torch.distributed.run", "torchrun")):
        text = text.replace(path, short)
    return text


# ---- part 3: `ddprun status` of a simulated job -------------------------------------------------------------
def status_key(suffix):
    """A key as ddprun's agents name it (RoundKeys::key; torch's client sends it as given, ddprun's adds a
    leading "/" on the wire: both reach the same stored key)."""
    return f"ddprun/{RUN_ID}/{suffix}"


def identity(i):
    return f"node-{i:04d}.cluster.example:{100000 + i}"


def status_document(i, nodes, ranks, step):
    """The document agent i would publish while its ranks train (agent/observe/status_report.h, schema 1), as
    nlohmann's dump writes it: compact, keys sorted."""
    rng = random.Random(i * 1000003 + step)
    return json.dumps({
        "v": 1, "host": identity(i).split(":")[0], "pid": 100000 + i, "backend": "c10d", "state": "running",
        "detail": "", "time": time.time(), "round": 0, "node_rank": i, "nodes": nodes, "local_world_size": ranks,
        "base_rank": i * ranks, "world_size": nodes * ranks, "restarts_used": 0, "restarts_max": 3,
        "restarts_caused": 0,
        "ranks": [{"rank": i * ranks + r, "local_rank": r, "pid": 200000 + i * ranks + r, "state": "running",
                   "progress_age_s": rng.uniform(0, 0.5), "step": step, "step_time_s": rng.uniform(0.24, 0.26),
                   "before_collective_s": rng.uniform(0.01, 0.03)} for r in range(ranks)],
    }, separators=(",", ":"), sort_keys=True)


class Writer(threading.Thread):
    """Rewrites agent documents round robin at `per_s` sets per second through a client of its own."""

    def __init__(self, store, nodes, ranks, per_s):
        super().__init__(daemon=True)
        self.store, self.nodes, self.ranks, self.per_s = store, nodes, ranks, per_s
        self.sets, self.elapsed = 0, 0.0
        self.done = threading.Event()

    def run(self):
        t0 = time.monotonic()
        while True:
            delay = t0 + self.sets / self.per_s - time.monotonic()
            if delay > 0:
                self.done.wait(delay)
            if self.done.is_set():
                break
            i = self.sets % self.nodes
            self.store.set(status_key(f"status/{identity(i)}"),
                           status_document(i, self.nodes, self.ranks, 1000 + self.sets // self.nodes))
            self.sets += 1
        self.elapsed = time.monotonic() - t0

    def stop(self):
        self.done.set()
        self.join()


def check_status(form, out, nodes, ranks):
    """None when `ddprun status` printed the whole simulated job, else what is wrong."""
    if form == "table":
        head = out.split("\n", 1)[0]
        want = f"{nodes} node(s), {nodes * ranks} rank(s)"
        return None if ": running," in head and want in head else f"first line: {head!r}"
    if form == "version":
        return None if out.strip() else "no output"
    s = json.loads(out)
    states = sorted({n["state"] for n in s["nodes"]})
    if len(s["nodes"]) != nodes or len(s["ranks"]) != nodes * ranks or states != ["running"]:
        return f"{len(s['nodes'])} nodes, {len(s['ranks'])} ranks, node states {states}"
    return None


def measure_status(args, env):
    from torch.distributed import TCPStore  # only here: parts 1 and 2 need no torch in this process

    print(f"  status: simulating {args.nodes} agents × {args.ranks} ranks", file=sys.stderr, flush=True)
    proc, port = start_ddprun_store(args.store, "warn")
    endpoint = f"127.0.0.1:{port}"
    base = [args.ddprun, "status", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", RUN_ID]
    forms = {"json": base + ["--json"], "table": base, "version": [args.ddprun, "--version"]}
    calls = {form: [] for form in forms}
    try:
        timeout = datetime.timedelta(seconds=30)
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        doc_bytes = 0
        for i in range(args.nodes):
            doc = status_document(i, args.nodes, args.ranks, 1000)
            doc_bytes += len(doc)
            client.set(status_key(f"status/{identity(i)}"), doc)
            client.set(status_key(f"status/{client.add(status_key('status/n'), 1) - 1}"), identity(i))
            client.set(status_key(f"live/{identity(i)}"), "1")
        writer = Writer(TCPStore("127.0.0.1", port, is_master=False, timeout=timeout), args.nodes, args.ranks,
                        args.write_rate)
        writer.start()
        try:
            for rep in range(args.status_reps + 1):  # the first round is a warm-up, not counted
                for form, argv in forms.items():
                    t0 = time.perf_counter()
                    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
                    wall = time.perf_counter() - t0
                    error = (f"exit code {res.returncode}: {res.stderr.strip()}" if res.returncode
                             else check_status(form, res.stdout, args.nodes, args.ranks))
                    if error:
                        print(f"  status --{form}: {error}", file=sys.stderr, flush=True)
                    if rep:
                        calls[form].append({"wall_s": wall, "error": error, "output_bytes": len(res.stdout)})
        finally:
            writer.stop()
    finally:
        proc.kill()
        proc.wait()
    print("  status: " + "  ".join(f"{f} median {statistics.median(c['wall_s'] for c in v):.3f} s"
                                   for f, v in calls.items()), file=sys.stderr, flush=True)
    return {"nodes": args.nodes, "ranks": args.ranks, "document_bytes_avg": doc_bytes / args.nodes,
            "write_rate_target": args.write_rate, "write_rate": writer.sets / writer.elapsed if writer.elapsed else 0,
            "calls": calls,
            "commands": {f: " ".join(argv).replace(args.ddprun, "ddprun").replace(endpoint, "127.0.0.1:PORT")
                         for f, argv in forms.items()}}


# ---- report -----------------------------------------------------------------------------------------------
def fmt_pct(x):
    return "—" if x is None else f"{x:.2f} %"


def fmt_num(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}"


def median_or_none(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def torch_version(python):
    res = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return res.stdout.strip() or "?"


def report(args, variants, runs, status, commands, version, load_before, load_after, elapsed):
    print(f"{machine_line(load_before, load_after)}; torch {version}; measurement took {elapsed:.0f} s.\n")
    lo, hi = (f * args.train_s for f in WINDOW)
    if args.reps > 0:
        print(f"Job: ddp_train.py on 2 nodes × {NPROC} ranks over loopback (static rendezvous, node 0 hosts the "
              f"store), gloo on CPUs, batch 16, --step-sleep {STEP_SLEEP:g}; trains {args.train_s:g} s after every "
              f"rank's first step, then stops (--stop-file). Agent CPU: utime+stime of the agent process alone, "
              f"% of one core; whole run = over the agent's wall time (start, rendezvous, training, exit); "
              f"steady = from {lo:g} s to {hi:g} s of the training. Medians over the runs that ended well.\n")
        print("| launcher | observability | runs ok | agent CPU, node 0 (store host): whole run | node 1: whole run "
              "| node 0: steady | node 1: steady | agent wall | store requests/s per node (steady) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for v in variants:
            ok = [r for r in runs[v] if run_ok(r)]
            launcher, what = VARIANTS[v]

            def agent_median(key, node):
                return median_or_none(r["agents"][node][key] for r in ok)

            reqs = median_or_none(r.get("requests_per_node_s") for r in ok)
            print(f"| {launcher} | {what} | {len(ok)} of {len(runs[v])} | {fmt_pct(agent_median('cpu_pct', 0))} | "
                  f"{fmt_pct(agent_median('cpu_pct', 1))} | {fmt_pct(agent_median('steady_cpu_pct', 0))} | "
                  f"{fmt_pct(agent_median('steady_cpu_pct', 1))} | {fmt_num(agent_median('wall_s', 0), 1)} s | "
                  f"{fmt_num(reqs) if v == 'ddprun-metrics' else '—'} |")
        print("\nGoals (the issue): agent CPU < 1 % of a core; ≤ 1 store request/s per node.")
        by_series = [r["requests_per_s_by_series"] for v in variants for r in runs[v]
                     if run_ok(r) and r.get("requests_per_s_by_series")]
        if by_series:
            series = sorted({k for b in by_series for k in b})
            medians = {k: statistics.median(b.get(k, 0) for b in by_series) for k in series}
            print("Store requests/s (all nodes together) at node 0's store by series, steady, median of the runs: "
                  + ", ".join(f"`{k}` {x:.2f}" for k, x in sorted(medians.items(), key=lambda kv: -kv[1])) + ".")
        leaked = sum(r["leaked"] for v in variants for r in runs[v])
        print(f"Leaked processes: {leaked or 'none'}.")
    if status:
        print(f"\n`ddprun status` of a simulated c10d job: {status['nodes']} agents × {status['ranks']} ranks in "
              f"one ddprun-store, round 0, all running (documents of {status['document_bytes_avg']:.0f} bytes on "
              f"average); a second client rewrote documents at {status['write_rate']:.0f} sets/s (target "
              f"{status['write_rate_target']:g}) meanwhile; wall time of the whole command (process start "
              f"included), after one untimed call.\n")
        print("| command | calls | answers complete | median | max |")
        print("|---|---:|---:|---:|---:|")
        for form, what in (("json", "ddprun status --json"), ("table", "ddprun status (table)"),
                           ("version", "ddprun --version (program start, the floor)")):
            calls = status["calls"][form]
            walls = [c["wall_s"] for c in calls]
            good = sum(1 for c in calls if not c["error"])
            print(f"| {what} | {len(calls)} | {good} | {statistics.median(walls):.3f} s | {max(walls):.3f} s |")
        print("\nGoal (the issue): `status` of a 1,000-node job in ≤ 1 s.")
    print_commands("`$TMP/run` fresh per run, free ports picked per run; node 1 differs only in --node_rank",
                   [commands[v] for v in variants if v in commands]
                   + (list(status["commands"].values()) if status else []))


if __name__ == "__main__":
    sys.exit(main())
