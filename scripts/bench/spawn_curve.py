"""What ddprun adds per worker, against the kernel's own cost of starting the same processes.

Run by scripts/bench-launcher.sh (BENCH_CURVE=1); standard library only. For each N in --sizes, interleaved,
--reps runs each (plus one warm-up per size):
  ddprun   launch-to-exit of `ddprun --standalone --nproc_per_node N --no_python fake_worker --exit 0`
           (posix_spawn -> wait4 of the agent, from this process; the workers' output goes to the agent's
           stdout, a file)
  floor    the same N `fake_worker --exit 0` started with os.posix_spawn from this process, all at once, then
           waited for: what starting and reaping N such processes costs on this machine, without any agent
The report gives medians, ddprun - floor (the agent's whole cost: its own start, store, rendezvous, spawning,
supervision, exit) and the agent's cost per extra worker, (overhead(N) - overhead(1)) / (N - 1).

Exit codes: 0 done, 2 bad arguments.
"""

import argparse
import os
import statistics
import sys
import time

from bench_harness import add_json_arg, add_token_arg, in_work_dir, load_average, run_once, sweep, write_json


def floor_once(worker, n, env):
    """Starts n `worker --exit 0` at once and waits for all; wall time in ns."""
    null = os.open("/dev/null", os.O_WRONLY)
    actions = [(os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)]
    t0 = time.perf_counter_ns()
    pids = [os.posix_spawn(worker, [worker, "--exit", "0"], env, file_actions=actions) for _ in range(n)]
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    t1 = time.perf_counter_ns()
    os.close(null)
    return t1 - t0, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--worker", required=True, help="fake_worker binary")
    ap.add_argument("--sizes", default="1,8,32,128")
    ap.add_argument("--reps", type=int, default=15)
    add_token_arg(ap)
    add_json_arg(ap)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1:
        ap.error("--sizes: comma-separated positive numbers")
    return in_work_dir("ddprun-bench-curve-", args.token, lambda work: measure(args, sizes, work))


def measure(args, sizes, work):
    env = dict(os.environ, OMP_NUM_THREADS="1", BENCH_LAUNCHER_TOKEN=args.token)
    results = {n: {"ddprun": [], "floor": [], "failed": 0} for n in sizes}
    load_before = load_average()
    for rep in range(args.reps + 1):
        for n in sizes:
            argv = [args.ddprun, "--standalone", "--nproc_per_node", str(n), "--no_python", args.worker,
                    "--exit", "0"]
            res = run_once(argv, env, os.path.join(work, "out.log"), 60)
            leaked = sweep(args.token)
            floor_ns, floor_failed = floor_once(args.worker, n, env)
            if rep == 0:
                continue  # warm-up
            ok = res["rc"] == 0 and not res["timed_out"] and not leaked and not floor_failed
            if not ok:
                results[n]["failed"] += 1
                continue
            results[n]["ddprun"].append(res["wall_ns"] / 1e6)
            results[n]["floor"].append(floor_ns / 1e6)
        print(f"  curve: rep {rep}/{args.reps} done", file=sys.stderr, flush=True)
    load_after = load_average()

    med = {n: (statistics.median(r["ddprun"]), statistics.median(r["floor"])) for n, r in results.items()
           if r["ddprun"]}
    print(f"Agent cost per worker (median of {args.reps} runs per size, interleaved; load average before "
          f"{' '.join(load_before)}, after {' '.join(load_after)}):\n")
    print("| workers | ddprun launch-to-exit | floor: posix_spawn + wait of the same workers | ddprun − floor | "
          "per extra worker, beyond the floor | failed runs |")
    print("|---:|---:|---:|---:|---:|---:|")
    base = med.get(sizes[0])
    for n in sizes:
        if n not in med:
            print(f"| {n} | — | — | — | — | {results[n]['failed']} |")
            continue
        d, f = med[n]
        per = "—"
        if base and n > sizes[0]:
            per = f"{((d - f) - (base[0] - base[1])) / (n - sizes[0]):.2f} ms"
        print(f"| {n} | {d:.1f} ms | {f:.1f} ms | {d - f:.1f} ms | {per} | {results[n]['failed']} |")
    write_json(args.json, {"load_before": load_before, "load_after": load_after, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
