"""Hang benchmark: one rank of a DDP job stops for good; how long until the launcher ends the group?

Run by scripts/bench-hang.sh; standard library only (the torch Pythons only run the launchers and the
workers). A real 3-rank DDP job on CPUs (scripts/examples/ddp_train.py: gloo, a small MLP) in which rank 2
calls stuck_in_data_loading() (a sleep outside any collective) at step 10 while ranks 0 and 1 wait in their
all-reduce. Every configuration runs `--standalone --nproc_per_node 3 --max_restarts 0 --redirects 1 --tee 1`
(Debian's torch 1.13.1 torchrun crashes at its start without them, see docs/benchmarks.md) with gloo's timeout
at torch's default (init_process_group(timeout=1800 s)), so nothing but the launcher can end the wait early.
ddp_train.py --stamp writes 'hang 0 2 <unix ns>' when rank 2 stops.
Per run:
  detection     the hang stamp -> the launcher's exit (the group stopped, the summary printed)
  named         ddprun's "where the ranks are" line names rank 2 in stuck_in_data_loading
A launcher that has not exited --cap seconds after the hang is killed with its workers and reported as
"still waiting" (torchrun: it would wait for gloo's 1800 s).

False positives (--false-positive-s S > 0): ddprun --hang_timeout 30 on a job whose three ranks train
normally for S seconds (the job is long enough and is stopped with SIGTERM at S); the run passes when ddprun
never reported a hang.

Configurations (--configs):
  ddprun-1.13    ddprun --hang_timeout H, workers `--python /usr/bin/python3` (torch 1.13)
  ddprun-2.6     ddprun --hang_timeout H, workers `--python scripts/torch26-python` (torch 2.6)
  torchrun-1.13  torch 1.13's torchrun, defaults
  torchrun-2.6   torch 2.6's torchrun in the Debian 13 root (`torch26-root.sh run /usr/bin/torchrun`)

Leftovers: every process carries BENCH_LAUNCHER_TOKEN=<token>; after each run those still alive are counted
(leaked) and SIGKILLed.

Exit codes: 0 done (runs that did not end show in the table), 2 bad arguments.
"""

import argparse
import os
import re
import signal
import statistics
import sys
import time

from bench_harness import (add_job_args, add_json_arg, add_token_arg, chosen_configs, in_work_dir, load_average,
                           machine_line, parse_stamps, print_commands, print_tail, shorten_paths, spawn_logged,
                           sweep, write_json)

CONFIG_TEXT = {
    "ddprun-1.13": ("ddprun", "1.13"),
    "ddprun-2.6": ("ddprun", "2.6"),
    "torchrun-1.13": ("torchrun 1.13", "1.13"),
    "torchrun-2.6": ("torchrun 2.6", "2.6"),
}
NPROC, HANG_RANK, HANG_STEP = 3, 2, 10


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_args(ap, "scripts/torch26-root.sh (torchrun 2.6)")
    ap.add_argument("--configs", default="ddprun-1.13,ddprun-2.6,torchrun-1.13,torchrun-2.6")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hang-timeout", type=float, default=15, help="ddprun's --hang_timeout")
    ap.add_argument("--cap", type=float, default=120, help="seconds after the hang before a run is killed")
    ap.add_argument("--false-positive-s", type=float, default=0,
                    help="also run a normal job under --hang_timeout 30 for this long (0: skip)")
    add_token_arg(ap)
    add_json_arg(ap)
    args = ap.parse_args()
    names = chosen_configs(ap, args, CONFIG_TEXT)
    return in_work_dir("ddprun-bench-hang-", args.token, lambda work: measure(args, names, work))


def run_launcher(argv, env, log_path, limit_s, cap=None, stop_signal=signal.SIGKILL):
    """Runs argv (spawn_logged: its own process group, output to log_path) until it exits or time runs out:
    limit_s after the start, or cap=(stamp file, seconds) after the stamp's hang line. Out of time, the
    launcher gets stop_signal (its process group SIGKILL 30 s later, or at once for SIGKILL).
    Returns dict: wall_ns, rc (negative: signal), timed_out."""
    t0 = time.monotonic_ns()
    pid = spawn_logged(argv, env, log_path)
    deadline = time.monotonic() + limit_s
    timed_out, kill_at = False, None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        now = time.monotonic()
        if cap and deadline > now + cap[1]:
            hang = parse_stamps(cap[0]).get(("hang", 0))
            if hang:
                deadline = min(deadline, now + cap[1])
        if not timed_out and now >= deadline:
            timed_out = True
            os.kill(pid, stop_signal)
            kill_at = now + (0 if stop_signal == signal.SIGKILL else 30)
        if kill_at is not None and now >= kill_at:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            kill_at = None
        time.sleep(0.05)
    return {"wall_ns": time.monotonic_ns() - t0, "rc": os.waitstatus_to_exitcode(status), "timed_out": timed_out}


def launcher_argv(args, name):
    hang = ["--hang_timeout", f"{args.hang_timeout:g}"]
    return {
        "ddprun-1.13": [args.ddprun, "--python", args.python] + hang,
        "ddprun-2.6": [args.ddprun, "--python", args.torch26_python or ""] + hang,
        "torchrun-1.13": [args.python, "-m", "torch.distributed.run"],
        "torchrun-2.6": [args.torch26_root or "", "run", "/usr/bin/torchrun"],
    }[name]


def measure(args, names, work):
    env = dict(os.environ, OMP_NUM_THREADS="1", BENCH_LAUNCHER_TOKEN=args.token, USE_LIBUV="0")
    results = {n: {"runs": [], "command": None} for n in names}
    load_before = load_average()
    started = time.monotonic()
    for i in range(args.reps):
        for name in names:
            d = os.path.join(work, f"{name}-{i}")
            os.makedirs(d)
            stamp = os.path.join(d, "stamp")
            argv = launcher_argv(args, name) + [
                "--standalone", "--nproc_per_node", str(NPROC), "--max_restarts", "0",
                "--redirects", "1", "--tee", "1", args.train, "--steps", "100000", "--batch", "16",
                "--log-every", "1000000", "--pg-timeout", "1800", "--hang-rank", str(HANG_RANK),
                "--hang-step", str(HANG_STEP), "--stamp", stamp]
            results[name]["command"] = results[name]["command"] or display(args, argv, work, d)
            load = load_average()[0]
            # The cap counts from the hang; starting the job (imports, rendezvous) gets up to 120 s more.
            res = run_launcher(argv, env, os.path.join(d, "out.log"), 120 + args.cap, cap=(stamp, args.cap))
            ended = time.time_ns()
            leaked = sweep(args.token)
            hang = parse_stamps(stamp).get(("hang", 0), {}).get(HANG_RANK)
            out = open(os.path.join(d, "out.log"), errors="replace").read()
            where = re.search(r"where the ranks are: (.*)", out)
            run = {"rc": res["rc"], "timed_out": res["timed_out"], "load1": float(load), "leaked": len(leaked),
                   "hung": hang is not None, "where": where.group(1) if where else None}
            if hang is not None and not res["timed_out"]:
                run["detection_s"] = (ended - hang) / 1e9
            run["named"] = bool(where and re.match(r"rank 2: .*stuck_in_data_loading", where.group(1)))
            results[name]["runs"].append(run)
            what = (f"ended {run['detection_s']:.1f} s after the hang, rc {res['rc']}" if "detection_s" in run
                    else f"still waiting {args.cap:.0f} s after the hang (killed)" if hang is not None
                    else f"rank 2 never hung (rc {res['rc']})")
            print(f"  {name:14} load {load}  {what}{'  leaked ' + str(len(leaked)) if leaked else ''}",
                  file=sys.stderr, flush=True)
            if hang is None:
                print_tail(out)
    false_positive = run_false_positive(args, env, work) if args.false_positive_s > 0 else None
    load_after = load_average()
    report(args, names, results, false_positive, load_before, load_after, time.monotonic() - started)
    write_json(args.json, {"load_before": load_before, "load_after": load_after, "results": results,
                           "false_positive": false_positive})
    return 0


def run_false_positive(args, env, work):
    """ddprun --hang_timeout 30 over a normally training job, stopped with SIGTERM after the given time."""
    d = os.path.join(work, "false-positive")
    os.makedirs(d)
    argv = [args.ddprun, "--python", args.python, "--hang_timeout", "30", "--standalone", "--nproc_per_node",
            str(NPROC), "--max_restarts", "0", args.train, "--steps", "100000000", "--batch", "16",
            "--log-every", "500"]
    print(f"  false positives: a normal job for {args.false_positive_s:.0f} s under --hang_timeout 30",
          file=sys.stderr, flush=True)
    res = run_launcher(argv, env, os.path.join(d, "out.log"), args.false_positive_s, stop_signal=signal.SIGTERM)
    sweep(args.token)
    out = open(os.path.join(d, "out.log"), errors="replace").read()
    steps = [int(m) for m in re.findall(r"step (\d+)/", out)]
    return {"seconds": res["wall_ns"] / 1e9, "ran_to_the_end": res["timed_out"],
            "hang_reported": "no rank made progress" in out, "last_step": max(steps, default=0),
            "command": display(args, argv, work, d)}


def display(args, argv, work, d):
    return shorten_paths(" ".join(argv).replace(d, "$TMP/run").replace(work, "$TMP"), args)


def report(args, names, results, false_positive, load_before, load_after, elapsed):
    print(f"{machine_line(load_before, load_after)}; measurement took {elapsed:.0f} s.")
    print(f"Job: ddp_train.py, {NPROC} ranks, gloo (timeout 1800 s, torch's default), batch 16; rank {HANG_RANK} "
          f"sleeps in stuck_in_data_loading() at step {HANG_STEP}; --max_restarts 0; ddprun --hang_timeout "
          f"{args.hang_timeout:g}; a run still going {args.cap:.0f} s after the hang is killed.\n")
    print("| launcher | torch | runs | hang → launcher exit: median | min–max | exit code | names rank 2 and "
          "its function | still waiting at the cap | load (1 min) min–max |")
    print("|---|---|---:|---:|---:|---|---|---:|---:|")
    for name in names:
        launcher, version = CONFIG_TEXT[name]
        runs = [r for r in results[name]["runs"] if r["hung"]]
        det = [r["detection_s"] for r in runs if "detection_s" in r]
        waiting = sum(1 for r in runs if r["timed_out"])
        rcs = sorted({r["rc"] for r in runs if not r["timed_out"]})
        named = "—" if launcher != "ddprun" else f"{sum(r['named'] for r in runs)} of {len(runs)}"
        loads = [r["load1"] for r in results[name]["runs"]] or [0]
        print(f"| {launcher} | {version} | {len(runs)} | "
              f"{f'{statistics.median(det):.1f} s' if det else '—'} | "
              f"{f'{min(det):.1f}–{max(det):.1f} s' if det else '—'} | {', '.join(map(str, rcs)) or '—'} | "
              f"{named} | {waiting} of {len(runs)} | {min(loads):.2f}–{max(loads):.2f} |")
    leaked = {n: sum(r["leaked"] for r in results[n]["runs"]) for n in names}
    print(f"\nLeaked processes: {({n: k for n, k in leaked.items() if k}) or 'none'}.")
    example = next((r["where"] for n in names for r in results[n]["runs"] if r.get("where")), None)
    if example:
        print(f"\nddprun's line (first run): `where the ranks are: {example}`")
    if false_positive:
        fp = false_positive
        print(f"\nFalse positives: a normal 3-rank job (torch 1.13) under `--hang_timeout 30` for {fp['seconds']:.0f} s "
              f"(to step {fp['last_step']}): "
              + ("hang reported (FALSE POSITIVE)" if fp["hang_reported"] else
                 "never reported as hung" + ("" if fp["ran_to_the_end"] else " (but the job ended early)")) + ".")
    print_commands(f"`$TMP/run` fresh per run; torchrun = {args.python} -m torch.distributed.run",
                   [results[name]["command"] for name in names] + [(false_positive or {}).get("command")])


if __name__ == "__main__":
    sys.exit(main())
