"""What the Python benchmark drivers of scripts/bench share: marked processes, timed runs, stamp files,
--configs, the machine line of a report, ddprun-store, and torch's rendezvous rounds.

Contract:
- Who imports it: the drivers, run as `PYTHON scripts/bench/X.py` (so this folder is sys.path[0]) by the host's
  /usr/bin/python3 (3.11) or, for the torch simulations, by the torch 2.6 root's python3 (3.13, through
  scripts/torch26-python, which bind-mounts the checkout at the same path). Standard library only, Python
  3.9+; nothing here imports torch, parses the command line or runs at import.
- Output: only print_tail (stderr) and print_round (stdout, one JSON line) print; the rest returns values.
- Marked processes: a run's environment carries BENCH_LAUNCHER_TOKEN=<token> (the drivers' --token, the same
  token scripts/bench/common.sh's run_marked gives the driver itself); sweep(token) finds, and SIGKILLs,
  every other process whose environment holds it, so launchers and workers left behind are counted and
  never outlive the benchmark. Only processes started with the token can carry it.
- Threads and signals: run_once and in_work_dir install signal handlers (SIGALRM, SIGTERM), so they belong
  to the main thread; rendezvous_round runs one thread per handler.
- Errors: a process that fails or times out is a result (rc, timed_out), never an exception; a missing or
  partial stamp file reads as fewer events; chosen_configs reports bad names through argparse (exit 2);
  start_ddprun_store raises RuntimeError when the store prints no "listening on" line.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


# ---- marked processes -----------------------------------------------------------------------------------
def add_token_arg(ap):
    """--token: the BENCH_LAUNCHER_TOKEN value of this run (default: unique to this process)."""
    ap.add_argument("--token", default=f"{os.getpid()}-{time.time_ns()}")


def sweep(token, kill=True):
    """Pids (not ours) whose environment holds BENCH_LAUNCHER_TOKEN=token; SIGKILLed when kill."""
    needle = f"BENCH_LAUNCHER_TOKEN={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    if kill:
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return found


def in_work_dir(prefix, token, measure):
    """Returns measure(work), work a fresh temporary directory named prefix...; SIGTERM becomes
    sys.exit(128 + 15), so that on every way out the processes still marked with token are killed (sweep) and
    the directory is removed."""
    work = tempfile.mkdtemp(prefix=prefix)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return measure(work)
    finally:
        sweep(token)
        shutil.rmtree(work, ignore_errors=True)


# ---- timed runs -------------------------------------------------------------------------------------------
def spawn_logged(argv, env, log_path):
    """posix_spawn of argv in a process group of its own (its pid is the group's id), stdin /dev/null, stdout
    and stderr to log_path (truncated). Returns the pid; the caller waits for it."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawn(argv[0], argv, env, file_actions=actions, setpgroup=0)


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def run_once(argv, env, log_path, timeout_s, sample_hwm=False):
    """Runs argv (spawn_logged) to its exit; past timeout_s its process group is SIGKILLed. Returns dict:
    wall_ns (posix_spawn -> wait4), rc (negative: signal), hwm_kb, timed_out.

    sample_hwm: the VmHWM of the process argv[1:] (argv[0] is /usr/bin/time), sampled every 1 ms."""
    hwm = [0]
    stop = threading.Event()
    signal.signal(signal.SIGALRM, _alarm)
    t0 = time.perf_counter_ns()
    pid = spawn_logged(argv, env, log_path)
    sampler = None
    if sample_hwm:
        def sample():
            agent = None
            while not stop.is_set():
                try:
                    if agent is None:  # the child of /usr/bin/time, once it has exec'ed
                        with open(f"/proc/{pid}/task/{pid}/children") as f:
                            kids = f.read().split()
                        if kids and os.readlink(f"/proc/{kids[0]}/exe") != "/usr/bin/time":
                            agent = int(kids[0])
                    if agent is not None:
                        with open(f"/proc/{agent}/status") as f:
                            for line in f:
                                if line.startswith("VmHWM:"):
                                    hwm[0] = max(hwm[0], int(line.split()[1]))
                except OSError:
                    if agent is not None:
                        return
                time.sleep(0.001)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    timed_out = False
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        _, status = os.waitpid(pid, 0)
        t1 = time.perf_counter_ns()
    except Timeout:
        timed_out = True
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
        t1 = time.perf_counter_ns()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        stop.set()
    if sampler:
        sampler.join()
    rc = os.waitstatus_to_exitcode(status)
    return {"wall_ns": t1 - t0, "rc": rc, "hwm_kb": hwm[0], "timed_out": timed_out}


def parse_stamps(path):
    """{(event, attempt): {rank: ns}} from a --stamp file of scripts/examples/ddp_train.py or tests/bin/fake_worker
    (lines `event attempt rank unix-ns`); {} when missing, and lines not of that form are skipped."""
    events = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return events
    for line in lines:
        parts = line.split()
        if len(parts) != 4 or not parts[3].isdigit():
            continue
        try:
            attempt, rank = int(parts[1]), int(parts[2])
        except ValueError:
            continue
        events.setdefault((parts[0], attempt), {})[rank] = int(parts[3])
    return events


def print_tail(text, lines=12):
    """The last lines of a failed run's output, indented, on stderr."""
    print("  --- last output:\n" + "\n".join("    " + line for line in text.splitlines()[-lines:]), file=sys.stderr)


# ---- the DDP job drivers' arguments: launchers, torch versions, --configs ------------------------------------
def add_job_args(ap, torch26_root_help):
    """--ddprun, --train, --python (torch 1.13), --torch26-root, --torch26-python."""
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--train", required=True, help="scripts/examples/ddp_train.py")
    ap.add_argument("--python", default="/usr/bin/python3", help="Python with torch 1.13")
    ap.add_argument("--torch26-root", help=torch26_root_help)
    ap.add_argument("--torch26-python", help="scripts/torch26-python (ddprun's workers with torch 2.6)")


def chosen_configs(ap, args, known):
    """The names of --configs (comma-separated); each must be in `known` (name -> (launcher, torch version,
    ...)), and a torch 2.6 one needs --torch26-root and --torch26-python (else ap.error)."""
    names = [n for n in args.configs.split(",") if n]
    for n in names:
        if n not in known:
            ap.error(f"unknown configuration {n}")
        if known[n][1] == "2.6" and not (args.torch26_root and args.torch26_python):
            ap.error(f"{n} needs --torch26-root and --torch26-python")
    return names


def shorten_paths(text, args):
    """A command line as a report shows it: add_job_args' paths by their short names, and
    `PYTHON -m torch.distributed.run` as torchrun."""
    for path, short in ((args.ddprun, "ddprun"), (args.train, "ddp_train.py"),
                        (args.torch26_python, "scripts/torch26-python"),
                        (args.torch26_root, "scripts/torch26-root.sh"),
                        (f"{args.python} -m torch.distributed.run", "torchrun")):
        if path:
            text = text.replace(path, short)
    return text


# ---- reports ------------------------------------------------------------------------------------------------
def add_json_arg(ap):
    """--json PATH: where write_json puts the raw results."""
    ap.add_argument("--json", help="write the raw results here")


def write_json(path, data):
    """data as indented JSON in path; nothing when path is None (no --json)."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)


def print_commands(intro, commands):
    """The report's block of command lines: "Commands (INTRO):", then the commands (empty ones left out) in a
    Markdown code block."""
    print(f"\nCommands ({intro}):\n\n```")
    for command in commands:
        if command:
            print(command)
    print("```")


def format_ms(ms, ms_decimals):
    """A duration given in ms, as a report shows it: "—" for None, seconds with 2 decimals from 1000 ms on,
    else milliseconds with ms_decimals decimals."""
    if ms is None:
        return "—"
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.{ms_decimals}f} ms"


def quantile(xs, q):
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    s = sorted(xs)
    if not s:
        return None
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def load_average():
    """The 1, 5 and 15 minute load averages, as /proc/loadavg writes them (strings)."""
    return open("/proc/loadavg").read().split()[:3]


def cpu_model():
    """/proc/cpuinfo's first model name ("?" without one)."""
    return next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")


def machine_line(load_before, load_after):
    """'Machine: N CPUs, MODEL, Linux RELEASE; load average before A B C, after D E F' (load_average()'s);
    the caller ends the sentence."""
    return (f"Machine: {os.cpu_count()} CPUs, {cpu_model()}, Linux {os.uname().release}; load average before "
            f"{' '.join(load_before)}, after {' '.join(load_after)}")


# ---- network-namespace hosts (scripts/test-cluster.sh: ddprun-h1..h4) -------------------------------------------
def netns_host_pids(host):
    """The processes running in host's network namespace."""
    out = subprocess.run(["ip", "netns", "pids", f"ddprun-h{host}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def kill_netns_host(host):
    """SIGKILLs every process of host's network namespace."""
    for pid in netns_host_pids(host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def poll_until(pred, timeout, interval=0.05):
    """pred()'s first true value within `timeout` s (polled every `interval` s), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return None


def end_netns_job(procs, hosts):
    """SIGKILLs everything on `hosts` and reaps `procs` ({host: Popen of its `test-cluster.sh exec`})."""
    for h in hosts:
        kill_netns_host(h)
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.wait()


# ---- ddprun-store -------------------------------------------------------------------------------------------
def start_ddprun_store(path, log_level, stderr=None):
    """Starts ddprun-store (path) on a free loopback port; returns (process, port) once it accepts connections
    (its first stdout line, "... listening on HOST:PORT"). stdout stays a text pipe; stderr goes to
    subprocess's stderr argument (None: ours; subprocess.STDOUT: the pipe). Raises RuntimeError, the store
    killed, when that line does not come."""
    proc = subprocess.Popen([path, "--host", "127.0.0.1", "--port", "0", "--log-level", log_level],
                            stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on .*:(\d+)$", line.strip())
    if not m:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"ddprun-store did not start: {line!r}")
    return proc, int(m.group(1))


# ---- torch's rendezvous, N nodes as threads (torch_*_rendezvous_sim.py) ---------------------------------------
def rendezvous_round(handlers, timeout_s):
    """Each handler's next_rendezvous() on a daemon thread of its own, all released at once by a barrier;
    waits for them until timeout_s + 30 s have passed. Returns one entry per handler: (t0, t1, rank, world
    size, None), t0 and t1 time.monotonic() before and after the call; (t0, t1, -1, -1, "Type: message") when
    it raised; None when it had not returned in time. Takes torch 1.13's (store, rank, world size) tuples
    and torch 2.x's RendezvousInfo."""
    n = len(handlers)
    results = [None] * n
    barrier = threading.Barrier(n)

    def node(i):
        barrier.wait()
        t0 = time.monotonic()
        try:
            info = handlers[i].next_rendezvous()
            if isinstance(info, tuple):  # torch 1.13: (store, rank, world size)
                _, rank, world = info
            else:  # torch 2.x: RendezvousInfo
                rank, world = info.rank, info.world_size
            results[i] = (t0, time.monotonic(), rank, world, None)
        except Exception as exc:  # noqa: BLE001 - reported, not handled
            results[i] = (t0, time.monotonic(), -1, -1, f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s + 30
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return results


def round_verdict(results, out):
    """Checks rendezvous_round's results (every node returned, no error, ranks 0..N-1 once each, world size N)
    and adds to out wall_ms (first call -> last return) and phases_ms when any node returned. Returns None
    when the round is right, else what is wrong."""
    n = len(results)
    error = None
    done = [r for r in results if r is not None]
    if len(done) < n:
        error = f"only {len(done)} of {n} nodes returned in time"
    elif any(r[4] for r in done):
        error = next(r[4] for r in done if r[4])
    elif sorted(r[2] for r in done) != list(range(n)):
        error = "ranks are not 0..N-1 each exactly once"
    elif any(r[3] != n for r in done):
        error = "a node got a world size other than N"
    if done:
        first = min(r[0] for r in done)
        ms = lambda t: (t - first) * 1e3  # noqa: E731
        out["wall_ms"] = ms(max(r[1] for r in done))
        out["phases_ms"] = {"last_node_started": ms(max(r[0] for r in done)),
                            "first_node_returned": ms(min(r[1] for r in done)),
                            "last_node_returned": ms(max(r[1] for r in done))}
    return error


def print_round(out, error):
    """A simulation's result: out with ok (and error, when not None) added, as one JSON line on stdout."""
    out["ok"] = error is None
    if error:
        out["error"] = error
    print(json.dumps(out), flush=True)
