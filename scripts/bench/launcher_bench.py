"""Launcher benchmark: ddprun against torchrun (torch.distributed.run) of torch 1.13 and 2.6, same workers, one run.

Run by scripts/bench-launcher.sh (which builds ddprun and fake_worker); standard library only, so any
Python 3.8+ runs it (the torch Pythons only run torchrun itself).

Launchers (--launchers): ddprun; torchrun = torch 1.13's, `PYTHON -m torch.distributed.run` with its defaults
(--monitor_interval 5); torchrun-0.1 = the same with --monitor_interval 0.1; torchrun-2.6 = torch 2.6's
/usr/bin/torchrun inside the Debian 13 root, `TORCH26_ROOT_SH run /usr/bin/torchrun` (--torch26-root; its
default --monitor_interval is 0.1). That wrapper (unshare, bind mounts, chroot: no exec of its own in the
end, the PID stays) is not part of torchrun: its cost alone is measured in the same run as `TORCH26_ROOT_SH
run /bin/true` (--wrapper-reps runs, interleaved like the others) and reported, and the launch-to-exit
table has a row with its median subtracted. The restart latency needs no correction: crash and replacements
both happen inside the root, after the wrapper. fake_worker (a host binary) runs inside the root too: /work
and /tmp are bind-mounted there, and the root's libstdc++ is newer than the host's.

Measured per launcher, every run with `--standalone --nproc_per_node N --redirects 1 --tee 1 --log_dir DIR
--no_python <fake_worker> ...` and OMP_NUM_THREADS=1 (torchrun warns otherwise):
  launch   launch-to-exit wall time (posix_spawn -> wait4) of N no-op workers (`fake_worker --exit 0`).
  restart  `--max_restarts 1`, workers `fake_worker --stamp FILE --crash-on-attempt 0`: on attempt 0, local
           rank 0 waits until the whole local group runs, stamps its crash time (CLOCK_REALTIME) and exits 1;
           the other ranks block until stopped. On attempt 1 every worker stamps its start and exits 0.
           Latency = last replacement's start - crash (also the first replacement's).
  rss      the launch run again under `/usr/bin/time -f %M` (the maximum RSS over the agent and the workers
           it reaped: the agent's own peak whenever it exceeds the worker's, whose peak alone is measured
           and printed too), while the agent's VmHWM is sampled every 1 ms from /proc (last sample before
           its exit). Not from this script's own wait4: posix_spawn's vfork lends the child this Python's
           memory map until exec, and the kernel counts its high-water mark into the child's ru_maxrss.
Runs of the launchers are interleaved, spread evenly over the whole measurement, so machine-load drift
hits each alike. One warm-up run per launcher is not counted. No torchrun run is started that would
likely end after --stop-at (the slowest run of its kind so far decides).

Leftovers: every run's environment carries BENCH_LAUNCHER_TOKEN=<token>; after each run the processes whose
environment holds it are counted (a launcher that leaves workers behind shows here) and SIGKILLed. A run
past its time limit has its process group and token holders killed and counts as failed.

Exit codes: 0 done (failed runs show in the table), 2 bad arguments.
"""

import argparse
import os
import re
import statistics
import sys
import time

from bench_harness import (add_json_arg, add_token_arg, cpu_model, format_ms, in_work_dir, load_average,
                           machine_line, parse_stamps, print_commands, quantile, run_once, sweep, write_json)


def crash_and_restarts(path, nproc):
    """(crash_ns, [start ns of attempt 1]) from a fake_worker --stamp file; None when incomplete."""
    events = parse_stamps(path)
    crash, starts = events.get(("crash", 0)), events.get(("start", 1), {})
    if not crash or len(starts) != nproc:
        return None
    return min(crash.values()), list(starts.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--worker", required=True, help="fake_worker binary")
    ap.add_argument("--python", default="/usr/bin/python3", help="Python with torch 1.13, for torchrun")
    ap.add_argument("--torch26-root", help="scripts/torch26-root.sh, for torchrun-2.6 (`... run /usr/bin/torchrun`)")
    ap.add_argument("--wrapper-reps", type=int, default=10, help="runs of `TORCH26_ROOT_SH run /bin/true`")
    ap.add_argument("--build-type", default="?", help="ddprun's CMAKE_BUILD_TYPE, for the report")
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--reps-ddprun", type=int, default=20)
    ap.add_argument("--reps-torch", type=int, default=7)
    ap.add_argument("--restart-reps-ddprun", type=int, default=20)
    ap.add_argument("--restart-reps-torch", type=int, default=5)
    ap.add_argument("--rss-reps", type=int, default=1, help="RSS runs per launcher")
    ap.add_argument("--stop-at", type=float, default=time.time() + 380,
                    help="unix time: no torchrun run is started that would likely end after it")
    add_token_arg(ap)
    add_json_arg(ap)
    ap.add_argument("--launchers", default="ddprun,torchrun,torchrun-0.1,torchrun-2.6")
    args = ap.parse_args()
    if args.nproc < 1:
        ap.error("--nproc must be >= 1")

    torchrun = [args.python, "-m", "torch.distributed.run"]
    all_launchers = {
        "ddprun": {"argv": [args.ddprun], "timeout": 30, "extra": []},
        "torchrun": {"argv": torchrun, "timeout": 90, "extra": []},
        "torchrun-0.1": {"argv": torchrun, "timeout": 90, "extra": ["--monitor_interval", "0.1"]},
    }
    if args.torch26_root:
        all_launchers["torchrun-2.6"] = {"argv": [args.torch26_root, "run", "/usr/bin/torchrun"], "timeout": 90,
                                         "extra": []}
    names = [n for n in args.launchers.split(",") if n]
    for n in names:
        if n not in all_launchers:
            ap.error(f"unknown launcher {n}" + (" (needs --torch26-root)" if n == "torchrun-2.6" else ""))
    launchers = {n: all_launchers[n] for n in names}

    return in_work_dir("ddprun-bench-launcher-", args.token, lambda work: measure(args, launchers, work))


def measure(args, launchers, work):
    env = dict(os.environ, OMP_NUM_THREADS="1", BENCH_LAUNCHER_TOKEN=args.token)
    common = ["--standalone", "--nproc_per_node", str(args.nproc), "--redirects", "1", "--tee", "1"]
    counter = [0]

    def command(name, kind, stamp=None):
        l = launchers[name]
        counter[0] += 1
        logs = os.path.join(work, f"logs-{counter[0]}")
        argv = l["argv"] + common + l["extra"] + ["--log_dir", logs]
        if kind == "restart":
            argv += ["--max_restarts", "1", "--no_python", args.worker, "--stamp", stamp,
                     "--crash-on-attempt", "0"]
        else:
            argv += ["--no_python", args.worker, "--exit", "0"]
        return argv

    def display(argv):
        out = []
        for a in argv:
            a = a.replace(args.ddprun, "ddprun").replace(args.worker, "fake_worker").replace(work, "$TMP")
            if args.torch26_root:
                a = a.replace(args.torch26_root, "scripts/torch26-root.sh")
            out.append("torchrun" if a == "torch.distributed.run" else a)
        s = re.sub(r"\$TMP/(logs|stamp)-[0-9]+", r"$TMP/\1-K", " ".join(out))
        return s.replace(f"{args.python} -m torchrun", "torchrun")

    results = {n: {"launch": [], "restart": [], "restart_first": [], "maxrss": [], "hwm": [], "failed": 0,
                   "leaked": 0, "commands": {}} for n in launchers}
    # The torch 2.6 root's wrapper alone: `torch26-root.sh run /bin/true`, timed like a launch.
    wrapper = {"launch": [], "failed": 0} if "torchrun-2.6" in launchers else None
    slowest = {}  # (launcher, kind) -> longest wall time so far, seconds

    def probe_wrapper():
        res = run_once([args.torch26_root, "run", "/bin/true"], env, os.path.join(work, "wrapper.log"), 30)
        ok = res["rc"] == 0 and not res["timed_out"]
        print(f"  {'wrapper':13} {'probe':8} {res['wall_ns'] / 1e6:9.1f} ms  {'ok' if ok else 'FAILED'}",
              file=sys.stderr, flush=True)
        if ok:
            wrapper["launch"].append(res["wall_ns"] / 1e6)
        else:
            wrapper["failed"] += 1

    def one(name, kind, counted=True):
        if name == "wrapper":
            return probe_wrapper()
        stamp = os.path.join(work, f"stamp-{counter[0] + 1}") if kind == "restart" else None
        argv = command(name, kind, stamp)
        r = results[name]
        if counted:
            r["commands"].setdefault(kind, display(argv))
        rss_file = os.path.join(work, "rss")
        if kind == "rss":
            argv = ["/usr/bin/time", "-f", "%M", "-o", rss_file] + argv
        log_path = os.path.join(work, f"{name}-{kind}.log")
        timeout = launchers[name]["timeout"]
        if name != "ddprun":
            timeout = max(10.0, min(timeout, args.stop_at + 40 - time.time()))
        res = run_once(argv, env, log_path, timeout, sample_hwm=(kind == "rss"))
        slowest[(name, kind)] = max(slowest.get((name, kind), 0), res["wall_ns"] / 1e9)
        leaked = sweep(args.token)
        ok = res["rc"] == 0 and not res["timed_out"]
        detail = ""
        if kind == "restart" and ok:
            stamps = crash_and_restarts(stamp, args.nproc)
            ok = stamps is not None
            if ok:
                detail = f"  latency {(max(stamps[1]) - stamps[0]) / 1e6:.1f} ms"
        maxrss = None
        if kind == "rss" and ok:
            maxrss = int(open(rss_file).read().split()[-1])
            detail = f"  time %M {maxrss / 1024:.1f} MiB, VmHWM {res['hwm_kb'] / 1024:.1f} MiB"
        status = "ok" if ok else f"FAILED rc={res['rc']}{' (timeout)' if res['timed_out'] else ''}"
        print(f"  {name:13} {kind:8} {res['wall_ns'] / 1e6:9.1f} ms{detail}"
              f"{'  leaked ' + str(len(leaked)) if leaked else ''}  {status}"
              f"{'' if counted else '  (warm-up)'}",
              file=sys.stderr, flush=True)
        if not ok:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-3000:]
            print(f"  --- last output of {name} ({kind}):\n{tail}", file=sys.stderr)
        if not counted:
            return
        r["leaked"] += len(leaked)
        if not ok:
            r["failed"] += 1
            return
        if kind == "launch":
            r["launch"].append(res["wall_ns"] / 1e6)
        elif kind == "restart":
            crash, starts = stamps
            r["restart"].append((max(starts) - crash) / 1e6)
            r["restart_first"].append((min(starts) - crash) / 1e6)
        elif kind == "rss":
            r["maxrss"].append(maxrss)
            if res["hwm_kb"]:
                r["hwm"].append(res["hwm_kb"])

    # The worker's own peak RSS, run alone (the bound under which /usr/bin/time's figure is the agent's own).
    rss_file = os.path.join(work, "worker-rss")
    wres = run_once(["/usr/bin/time", "-f", "%M", "-o", rss_file, args.worker, "--exit", "0"], env,
                    os.path.join(work, "worker.log"), 10)
    worker_rss = int(open(rss_file).read().split()[-1]) if wres["rc"] == 0 else 0

    # Schedule: each launcher's runs spread evenly over [0, 1), merged; launch and restart interleaved.
    plan = []
    for name in launchers:
        torch = name != "ddprun"
        for kind, reps in (("launch", args.reps_torch if torch else args.reps_ddprun),
                           ("restart", args.restart_reps_torch if torch else args.restart_reps_ddprun),
                           ("rss", args.rss_reps)):
            for i in range(reps):
                plan.append(((i + 0.5) / reps, name, kind))
    if wrapper is not None:
        for i in range(args.wrapper_reps):
            plan.append(((i + 0.5) / args.wrapper_reps, "wrapper", "probe"))
    plan.sort(key=lambda p: p[0])

    load_before = load_average()
    started = time.monotonic()
    print("launcher bench: warm-up", file=sys.stderr)
    for name in launchers:
        one(name, "launch", counted=False)
    skipped = {n: 0 for n in launchers}
    for _, name, kind in plan:
        expected = slowest.get((name, kind), slowest.get((name, "launch"), 0))
        if kind == "restart" and (name, kind) not in slowest:
            expected *= 2
        if name not in ("ddprun", "wrapper") and time.time() + expected > args.stop_at:
            skipped[name] += 1
            continue
        one(name, kind)
    elapsed = time.monotonic() - started
    load_after = load_average()

    # ---- report --------------------------------------------------------------------------------------------
    print(f"{machine_line(load_before, load_after)}; niceness {os.nice(0)}; measurement took {elapsed:.0f} s; "
          f"ddprun build {args.build_type}.")
    print(f"Workers: {args.nproc} × fake_worker (peak RSS alone {worker_rss / 1024:.1f} MiB).")
    wrapper_median = statistics.median(wrapper["launch"]) if wrapper and wrapper["launch"] else None
    if wrapper is not None:
        w = wrapper["launch"]
        text = f"no successful run ({wrapper['failed']} failed)"
        if w:
            text = (f"median {wrapper_median:.1f} ms, p90 {quantile(w, 0.9):.1f} ms, min {min(w):.1f} ms "
                    f"({len(w)} runs, {wrapper['failed']} failed)")
        print(f"torch 2.6 root wrapper alone (`torch26-root.sh run /bin/true`): {text}.")
    print()

    def ms(x):
        return format_ms(x, 1)

    def stat(xs, what):
        if not xs:
            return None
        return {"median": statistics.median(xs), "p90": quantile(xs, 0.9), "min": min(xs),
                "max": max(xs)}[what]

    cols = sorted(launchers, key=lambda n: n != "ddprun")
    header = {"ddprun": "ddprun", "torchrun": "torchrun 1.13 (defaults: monitor 5 s)",
              "torchrun-0.1": "torchrun 1.13 --monitor_interval 0.1",
              "torchrun-2.6": "torchrun 2.6 (defaults: monitor 0.1 s), in the root"}
    targets = {("launch", "median"): "≤ 30 ms", ("restart", "median"): "≤ 50 ms",
               ("maxrss", "max"): "≤ 10 MiB"}
    line = "| metric | target |"
    sep = "|---|---|"
    for c in cols:
        line += f" {header[c]} |"
        sep += "---:|"
        if c != "ddprun" and "ddprun" in launchers:
            line += " ÷ ddprun |"
            sep += "---:|"
    print(line)
    print(sep)

    def row(label, key, what, fmt, minus=None):
        """minus: {launcher: ms} subtracted from that launcher's figure; the others show '—'."""
        target = targets.get((key, what), "") if minus is None else ""
        out = f"| {label} | {target} |"
        base = stat(results["ddprun"][key], what) if "ddprun" in launchers else None
        for c in cols:
            v = stat(results[c][key], what)
            if minus is not None:
                v = v - minus[c] if v is not None and c in minus else None
            out += f" {fmt(v)} |"
            if c != "ddprun" and "ddprun" in launchers:
                out += f" {v / base:,.0f}× |" if v is not None and base else " — |"
        print(out)

    mib = lambda kb: "—" if kb is None else f"{kb / 1024:.1f} MiB"
    for key, label in (("launch", "launch-to-exit"),
                       ("restart", "restart: crash → last replacement started"),
                       ("restart_first", "restart: crash → first replacement started")):
        for what in ("median", "p90", "min"):
            row(f"{label}, {what}", key, what, ms)
        if key == "launch" and wrapper_median is not None:
            row(f"launch-to-exit, median, minus the root wrapper's median ({wrapper_median:.0f} ms)", key,
                "median", ms, minus={"torchrun-2.6": wrapper_median})
    row("agent peak RSS (`/usr/bin/time -f %M`, max of runs)", "maxrss", "max", mib)
    row("agent peak RSS (its VmHWM sampled every 1 ms, max of runs)", "hwm", "max", mib)
    counts = "| runs: launch / restart / rss / failed / leaked processes / skipped (time limit) | |"
    for c in cols:
        r = results[c]
        counts += (f" {len(r['launch'])} / {len(r['restart'])} / {len(r['maxrss'])} / {r['failed']}"
                   f" / {r['leaked']}"
                   f" / {skipped[c]} |")
        if c != "ddprun" and "ddprun" in launchers:
            counts += " |"
    print(counts)
    print_commands("`fake_worker` = BUILD/tests/bin/fake_worker, `$TMP/logs-K` and `$TMP/stamp-K` fresh per run; "
                   f"torchrun = {args.python} -m torch.distributed.run (torch 1.13); the rss runs are the launch "
                   "command under `/usr/bin/time -f %M`",
                   [results[c]["commands"].get(kind) for c in cols for kind in ("launch", "restart")])

    machine = {"cpus": os.cpu_count(), "cpu": cpu_model(), "load_before": load_before, "load_after": load_after,
               "niceness": os.nice(0)}
    write_json(args.json, {"machine": machine, "worker_rss_kb": worker_rss, "nproc": args.nproc,
                           "build_type": args.build_type, "wrapper": wrapper, "results": results,
                           "skipped": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
