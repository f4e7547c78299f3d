"""End-to-end recovery benchmark: a worker crashes, how long until every rank trains again?

Run by scripts/bench-recovery.sh; standard library only (the torch Pythons only run the launchers and the
workers). A real 2-rank DDP job on CPUs (scripts/examples/ddp_train.py: gloo, a small MLP, a checkpoint every
--save-every steps) under one launcher with --max_restarts 1. On attempt 0, rank --fail-rank crashes at step
--fail-step (os._exit(3), no clean-up: --fail-until-attempt 1); the launcher restarts the group, which
resumes from the checkpoint. ddp_train.py --stamp FILE writes, with CLOCK_REALTIME:
  start <attempt> <rank> t       first thing in the script, before `import torch`
  first-step <attempt> <rank> t  after the rank's first optimizer step of the attempt (its DDP all-reduce done)
  crash 0 <rank> t               just before the crashing rank's os._exit
Per run:
  recovery      crash -> the last rank's first step of attempt 1: every rank training again
  launcher part crash -> the last replacement script running (the launcher notices, stops the group, re-runs
                its rendezvous, starts the workers; for ddprun with torch 2.6 workers also the root wrapper)
  worker part   recovery - launcher part: Python and `import torch`, init_process_group, DDP, the
                checkpoint, the first step
  cold start    launcher spawned -> the last rank's first step of attempt 0
A run recovers when every rank stamps a first step in attempt 1 within --timeout seconds of the launcher's
start; one that does not is killed at the time limit or ends on its own, and counts as not recovered.

Configurations (--configs), all `--standalone --nproc_per_node N --max_restarts 1 --redirects 1 --tee 1`:
  ddprun-1.13           ddprun, workers `--python /usr/bin/python3` (torch 1.13)
  ddprun-2.6            ddprun, workers `--python scripts/torch26-python` (torch 2.6 in the Debian 13 root:
                        each worker passes through the root's wrapper, timed alone in the same run)
  ddprun-*-prestart     the same with --prestart (the default --prestart_delay 2): attempt 1 runs in the
                        standbys started 2 s after attempt 0 (agent/process/prestart.h)
  torchrun-1.13         torch 1.13's torchrun, defaults (--monitor_interval 5)
  torchrun-1.13-0.1     the same, --monitor_interval 0.1
  torchrun-2.6          torch 2.6's torchrun in the root (`torch26-root.sh run /usr/bin/torchrun`), defaults:
                        workers share the agent's TCPStore across attempts (pytorch#135712)
  torchrun-2.6-noshare  the same with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (the issue's workaround: rank 0
                        hosts a fresh store per attempt) and USE_LIBUV=0 (Debian's torch 2.6 has no libuv, and
                        env:// reads USE_LIBUV itself)
Runs are interleaved round-robin over the configurations. --reps runs each; the configurations in
--count-configs get --count-reps runs (if more), to count how many restarts recover.

Leftovers: like launcher_bench.py, every process carries BENCH_LAUNCHER_TOKEN=<token>; after each run those
still alive are counted (leaked) and SIGKILLed.

Exit codes: 0 done (failed runs show in the table), 2 bad arguments.
"""

import argparse
import os
import statistics
import sys
import time

from bench_harness import (add_job_args, add_json_arg, add_token_arg, chosen_configs, format_ms, in_work_dir,
                           load_average, machine_line, parse_stamps, print_commands, print_tail, quantile, run_once,
                           shorten_paths, sweep, write_json)

CONFIG_TEXT = {
    "ddprun-1.13": ("ddprun", "1.13", "workers --python /usr/bin/python3"),
    "ddprun-2.6": ("ddprun", "2.6", "workers --python scripts/torch26-python"),
    "ddprun-1.13-prestart": ("ddprun", "1.13", "--prestart, workers --python /usr/bin/python3"),
    "ddprun-2.6-prestart": ("ddprun", "2.6", "--prestart, workers --python scripts/torch26-python"),
    "torchrun-1.13": ("torchrun 1.13", "1.13", "defaults (--monitor_interval 5)"),
    "torchrun-1.13-0.1": ("torchrun 1.13", "1.13", "--monitor_interval 0.1"),
    "torchrun-2.6": ("torchrun 2.6", "2.6", "defaults (shared store)"),
    "torchrun-2.6-noshare": ("torchrun 2.6", "2.6", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"),
}
BASELINE = {"1.13": "ddprun-1.13", "2.6": "ddprun-2.6"}  # what the ratios divide by


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_args(ap, "scripts/torch26-root.sh (torchrun 2.6, the wrapper probe)")
    ap.add_argument("--configs", default="ddprun-1.13,ddprun-2.6,torchrun-1.13,torchrun-1.13-0.1,torchrun-2.6,"
                    "torchrun-2.6-noshare")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--count-configs", default="ddprun-2.6,torchrun-2.6")
    ap.add_argument("--count-reps", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--fail-step", type=int, default=12)
    ap.add_argument("--step-sleep", type=float, default=0.5,
                    help="ddp_train.py --step-sleep: each step also sleeps this long (a GPU step, CPU idle), so "
                    "the crash comes about fail-step x step-sleep seconds into training")
    ap.add_argument("--fail-rank", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60, help="seconds per run before it is killed")
    ap.add_argument("--wrapper-reps", type=int, default=10)
    ap.add_argument("--import-reps", type=int, default=3, help="runs of `python -c 'import torch.distributed'`")
    ap.add_argument("--stop-at", type=float, default=time.time() + 1500,
                    help="unix time: no run is started that would likely end after it")
    ap.add_argument("--build-type", default="?")
    add_token_arg(ap)
    add_json_arg(ap)
    args = ap.parse_args()
    names = chosen_configs(ap, args, CONFIG_TEXT)
    if not 0 <= args.fail_rank < args.nproc or not 0 <= args.fail_step < args.steps:
        ap.error("need 0 <= --fail-rank < --nproc and 0 <= --fail-step < --steps")
    return in_work_dir("ddprun-bench-recovery-", args.token, lambda work: measure(args, names, work))


def measure(args, names, work):
    env = dict(os.environ, OMP_NUM_THREADS="1", BENCH_LAUNCHER_TOKEN=args.token)
    torchrun13 = [args.python, "-m", "torch.distributed.run"]
    torchrun26 = [args.torch26_root, "run", "/usr/bin/torchrun"] if args.torch26_root else None
    launch = {
        "ddprun-1.13": ([args.ddprun], ["--python", args.python], {}),
        "ddprun-2.6": ([args.ddprun], ["--python", args.torch26_python], {}),
        "ddprun-1.13-prestart": ([args.ddprun], ["--prestart", "--python", args.python], {}),
        "ddprun-2.6-prestart": ([args.ddprun], ["--prestart", "--python", args.torch26_python], {}),
        "torchrun-1.13": (torchrun13, [], {}),
        "torchrun-1.13-0.1": (torchrun13, ["--monitor_interval", "0.1"], {}),
        "torchrun-2.6": (torchrun26, [], {}),
        "torchrun-2.6-noshare": (torchrun26, [], {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "USE_LIBUV": "0"}),
    }
    counter = [0]

    def command(name):
        counter[0] += 1
        k = counter[0]
        d = os.path.join(work, f"run-{k}")
        os.makedirs(d)
        prefix, extra, extra_env = launch[name]
        argv = prefix + ["--standalone", "--nproc_per_node", str(args.nproc), "--max_restarts", "1",
                         "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(d, "logs")] + extra
        argv += [args.train, "--steps", str(args.steps), "--log-every", "1000", "--fail-rank",
                 str(args.fail_rank), "--fail-step", str(args.fail_step), "--fail-until-attempt", "1",
                 "--stamp", os.path.join(d, "stamp"), "--checkpoint", os.path.join(d, "ckpt.pt"),
                 "--save-every", "5", "--step-sleep", str(args.step_sleep)]
        return argv, d, extra_env

    def display(argv, extra_env):
        text = shorten_paths(" ".join(argv).replace(work, "$TMP"), args)
        text = text.replace("$TMP/run-" + str(counter[0]), "$TMP/run-K")
        return " ".join(f"{k}={v}" for k, v in extra_env.items()) + (" " if extra_env else "") + text

    results = {n: {"runs": [], "leaked": 0, "command": None} for n in names}
    slowest = {}

    def one(name):
        argv, d, extra_env = command(name)
        r = results[name]
        r["command"] = r["command"] or display(argv, extra_env)
        load = load_average()[0]
        t_spawn = time.time_ns()
        res = run_once(argv, dict(env, **extra_env), os.path.join(d, "out.log"), args.timeout)
        slowest[name] = max(slowest.get(name, 0), res["wall_ns"] / 1e9)
        leaked = sweep(args.token)
        r["leaked"] += len(leaked)
        ev = parse_stamps(os.path.join(d, "stamp"))
        ranks = set(range(args.nproc))
        run = {"rc": res["rc"], "timed_out": res["timed_out"], "wall_s": res["wall_ns"] / 1e9,
               "load1": float(load), "leaked": len(leaked)}
        first0, first1 = ev.get(("first-step", 0), {}), ev.get(("first-step", 1), {})
        start1 = ev.get(("start", 1), {})
        crash = ev.get(("crash", 0), {}).get(args.fail_rank)
        if set(first0) == ranks:
            run["cold_ms"] = (max(first0.values()) - t_spawn) / 1e6
        run["crashed"] = crash is not None
        run["recovered"] = crash is not None and set(first1) == ranks
        if run["recovered"]:
            run["recovery_ms"] = (max(first1.values()) - crash) / 1e6
            if set(start1) == ranks:
                run["launcher_ms"] = (max(start1.values()) - crash) / 1e6
                run["worker_ms"] = run["recovery_ms"] - run["launcher_ms"]
        else:
            with open(os.path.join(d, "out.log"), errors="replace") as f:
                out = f.read()
            run["tail"] = out[-2000:]
            for marker in ("connectFullMesh", "Connection closed by peer", "Connection reset by peer",
                           "Socket Timeout", "Timed out", "DistStoreError"):
                if marker in out:
                    run.setdefault("markers", []).append(marker)
        r["runs"].append(run)
        detail = (f"recovery {run['recovery_ms']:.0f} ms (launcher {run.get('launcher_ms', float('nan')):.0f})"
                  if run["recovered"] else
                  f"NOT RECOVERED ({'time limit' if res['timed_out'] else 'rc=' + str(res['rc'])}; "
                  f"{', '.join(run.get('markers', [])) or 'no known marker'})")
        print(f"  {name:21} {res['wall_ns'] / 1e9:6.1f} s  load {load}  {detail}"
              f"{'  leaked ' + str(len(leaked)) if leaked else ''}", file=sys.stderr, flush=True)
        if not run["recovered"] or res["rc"] != 0:
            print_tail(run.get("tail", ""))

    # Side measurements: the root's wrapper alone, and a Python importing torch.distributed (both versions).
    side = {"wrapper_ms": [], "import_ms": {}}

    def timed(argv):
        res = run_once(argv, env, os.path.join(work, "side.log"), 60)
        return res["wall_ns"] / 1e6 if res["rc"] == 0 and not res["timed_out"] else None

    load_before = load_average()
    started = time.monotonic()
    pythons = {"1.13": args.python}
    if args.torch26_python:
        pythons["2.6"] = args.torch26_python
    for _ in range(args.import_reps):
        for version, py in pythons.items():
            v = timed([py, "-c", "import torch.distributed"])
            if v is not None:
                side["import_ms"].setdefault(version, []).append(v)
    if args.torch26_root:
        for _ in range(args.wrapper_reps):
            v = timed([args.torch26_root, "run", "/bin/true"])
            if v is not None:
                side["wrapper_ms"].append(v)

    count = {n for n in args.count_configs.split(",") if n}
    reps = {n: max(args.reps, args.count_reps) if n in count else args.reps for n in names}
    skipped = {n: 0 for n in names}
    for i in range(max(reps.values(), default=0)):
        for name in names:
            if i >= reps[name]:
                continue
            if time.time() + slowest.get(name, 20) > args.stop_at:
                skipped[name] += 1
                continue
            one(name)
    elapsed = time.monotonic() - started
    load_after = load_average()
    report(args, names, results, side, skipped, load_before, load_after, elapsed)
    write_json(args.json, {"load_before": load_before, "load_after": load_after, "build_type": args.build_type,
                           "nproc": args.nproc, "side": side, "results": results, "skipped": skipped})
    return 0


def report(args, names, results, side, skipped, load_before, load_after, elapsed):
    print(f"{machine_line(load_before, load_after)}; niceness {os.nice(0)}; measurement took {elapsed:.0f} s; "
          f"ddprun build {args.build_type}.")
    print(f"Job: ddp_train.py, {args.nproc} ranks, gloo, hidden 256, batch 64, --steps {args.steps}; rank "
          f"{args.fail_rank} crashes (os._exit) at step {args.fail_step} of attempt 0; each step also sleeps "
          f"{args.step_sleep} s (a GPU step: the CPU idle); checkpoint every 5 steps; "
          f"--max_restarts 1; time limit {args.timeout:.0f} s per run.")

    def med(xs):
        return statistics.median(xs) if xs else None

    wrapper = med(side["wrapper_ms"])
    imports = ", ".join(f"torch {v}: {med(xs) / 1000:.2f} s" for v, xs in side["import_ms"].items() if xs)
    print(f"`python -c 'import torch.distributed'` (median of {args.import_reps}): {imports or '—'}"
          + (f" (torch 2.6 through the root's wrapper)" if "2.6" in side["import_ms"] else "") + ".")
    if wrapper is not None:
        print(f"torch 2.6 root wrapper alone (`torch26-root.sh run /bin/true`, median of "
              f"{len(side['wrapper_ms'])}): {wrapper:.0f} ms.")
    print()

    def s(ms):
        return format_ms(ms, 0)

    def col(name, key):
        return [r[key] for r in results[name]["runs"] if r.get("recovered") and key in r]

    print("| launcher | torch | configuration | recovered | crash → all ranks training: median | p90 | min | "
          "÷ ddprun (same torch) | launcher part, median | worker part, median | cold start → all training, "
          "median | load (1 min) min–max |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        launcher, version, text = CONFIG_TEXT[name]
        runs = results[name]["runs"]
        rec = col(name, "recovery_ms")
        base_name = BASELINE[version]
        base = med(col(base_name, "recovery_ms")) if base_name in results else None
        ratio = f"{med(rec) / base:.1f}×" if rec and base else "—"
        cold = [r["cold_ms"] for r in runs if "cold_ms" in r]
        loads = [r["load1"] for r in runs]
        n_rec = sum(1 for r in runs if r["recovered"])
        fails = [r for r in runs if not r["recovered"]]
        why = ""
        if fails:
            hung = sum(1 for r in fails if r["timed_out"])
            why = f" ({len(fails) - hung} error, {hung} time limit)"
        if not runs:
            print(f"| {launcher} | {version} | {text} | 0 of 0 |" + " — |" * 8)
            continue
        print(f"| {launcher} | {version} | {text} | {n_rec} of {len(runs)}{why} | {s(med(rec))} | "
              f"{s(quantile(rec, 0.9))} | {s(min(rec) if rec else None)} | {ratio} | "
              f"{s(med(col(name, 'launcher_ms')))} | {s(med(col(name, 'worker_ms')))} | {s(med(cold))} | "
              f"{min(loads):.2f}–{max(loads):.2f} |")
    if wrapper is not None and "ddprun-2.6" in results:
        rec = col("ddprun-2.6", "recovery_ms")
        if rec:
            print(f"\nddprun with torch 2.6 workers, minus one pass through the root's wrapper ({wrapper:.0f} ms, "
                  f"which a torch 2.6 installed on the host would not need): recovery median "
                  f"{s(med(rec) - wrapper)}, launcher part {s(med(col('ddprun-2.6', 'launcher_ms')) - wrapper)}.")
    leaked = {n: results[n]["leaked"] for n in names if results[n]["leaked"]}
    print(f"\nLeaked processes: {leaked or 'none'}; runs skipped for the time limit: "
          f"{ {n: k for n, k in skipped.items() if k} or 'none' }.")
    print_commands(f"`$TMP/run-K` fresh per run; torchrun = {args.python} -m torch.distributed.run",
                   [results[name]["command"] for name in names])


if __name__ == "__main__":
    sys.exit(main())
