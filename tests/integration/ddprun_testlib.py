"""Shared helpers for ddprun's process-level integration tests (standard library only).

The tests start the real `ddprun` binary and real worker processes. Paths come from the environment that
tests/integration/CMakeLists.txt sets for ctest:

    DDPRUN       the ddprun executable
    FAKE_WORKER  tests/bin/fake_worker (see its header for flags)
    REPO         the source tree (for scripts/examples/ddp_train.py)

Hermeticity: every test gets a fresh temporary directory, ports come from binding port 0, waits are polls with
a deadline. Every agent is started with a unique DDPRUN_IT_TOKEN in its environment; workers inherit the
agent's environment (and grandchildren the workers'), so tearDown finds and SIGKILLs every process a test
started - even one re-parented to init - by scanning /proc/<pid>/environ for the token.

Skips: a test skips only when the machine cannot run it (no root, no network namespaces, Slurm not
installable), through skip_unless_required(), which fails instead under DDPRUN_REQUIRE_ALL_SUITES=1
(scripts/test.sh sets it). Everything else that keeps a suite from running is a failure. run_itest.py runs the
modules for ctest.
"""
import fcntl
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

import host_set

# The interpreter of the PyTorch workers: the host's torch 1.13 by default; ctest runs every PyTorch-facing
# module a second time with DDPRUN_IT_PYTHON=scripts/torch26-python (torch 2.6 in a Debian 13 root).
PYTHON = os.environ.get("DDPRUN_IT_PYTHON", "/usr/bin/python3")
# The interpreter that runs the tests themselves (and torch-free helpers such as rank_worker.py).
HOST_PYTHON = "/usr/bin/python3"
# The torch version (prefix, "2.6") the workers must import; ctest sets it for the .torch26 variants.
EXPECTED_TORCH = os.environ.get("DDPRUN_IT_TORCH") or None
# Set by scripts/test.sh: this machine must run every suite, so a would-be skip is a failure.
REQUIRE_ALL_SUITES = os.environ.get("DDPRUN_REQUIRE_ALL_SUITES", "0") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))
RANK_WORKER = os.path.join(HERE, "rank_worker.py")
# The light worker: ddp_train.py's options and outputs without torch (light_train.py), run by HOST_PYTHON with
# WITHOUT_TORCH first on its PYTHONPATH (so that --prestart's standbys do not import torch either).
LIGHT_TRAIN = os.path.join(HERE, "light_train.py")
WITHOUT_TORCH = os.path.join(HERE, "without_torch")
AGENT_LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\.\d{3}\] ddprun")  # ddprun's own log lines (spdlog)


def _required_path(name):
    value = os.environ.get(name)
    if not value or not os.path.exists(value):
        raise RuntimeError(f"environment variable {name} must name an existing path (got {value!r}); run these "
                           "tests through ctest, or set DDPRUN, FAKE_WORKER and REPO yourself")
    return value


DDPRUN = _required_path("DDPRUN")
FAKE_WORKER = _required_path("FAKE_WORKER")
REPO = _required_path("REPO")


def _ephemeral_ports():
    """The kernel's ephemeral port range (ip_local_port_range): where every outgoing connection's local port
    comes from."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago, chosen at random outside the kernel's ephemeral
    range (and off torch's defaults 29400 and 29500): a port from bind(0) is an ephemeral one, which any outgoing
    connection on this busy machine may take before the test's ddprun binds it (seen: a c10d endpoint "in use"
    by another process's connection that refused, 2026-11-28). Falls back to bind(0) when no random pick binds."""
    low, high = _ephemeral_ports()
    for _ in range(100):
        port = random.randint(10000, 28999)
        if low <= port <= high:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout, what, describe=lambda: "", interval=0.02):
    """Polls predicate() every `interval` s until it returns a truthy value (returned) or `timeout` seconds pass
    (AssertionError naming `what`, followed by describe())."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{describe()}")
        time.sleep(interval)


def torch_subject(test):
    """Marks a test method or class whose subject is torch itself, or how the launcher meets real torch workers:
    it runs with real PyTorch workers (scripts/examples/ddp_train.py and the like) and with every torch version
    (the .torch26 variant of a module runs only the tests marked so: run_itest.py). An unmarked test runs once,
    with the host's torch, and the netns helpers give it the light worker (light_train.py). docs/testing.md
    ("Which worker") says which tests are marked and why."""
    test.torch_subject = True
    return test


def is_torch_subject(test):
    """True when the unittest TestCase instance `test` runs a method or class marked with torch_subject()."""
    method = getattr(test, getattr(test, "_testMethodName", ""), None)
    return bool(getattr(method, "torch_subject", False) or getattr(type(test), "torch_subject", False))


def worker_for(test):
    """The training worker a test runs: "torch" when it is marked torch_subject, else "light"."""
    return "torch" if is_torch_subject(test) else "light"


def training_worker(worker, train):
    """(interpreter, script, extra environment) that run the training worker `worker`: "torch" runs `train`
    (ddp_train.py's path) with PYTHON, "light" runs LIGHT_TRAIN with HOST_PYTHON and torch hidden."""
    if worker == "torch":
        return PYTHON, train, {}
    if worker == "light":
        return HOST_PYTHON, LIGHT_TRAIN, {"PYTHONPATH": WITHOUT_TORCH}
    raise ValueError(f"worker must be 'torch' or 'light', not {worker!r}")


def skip_unless_required(reason):
    """Skips the test, class or module (unittest.SkipTest) because this machine cannot run it; `reason` says
    why. Under DDPRUN_REQUIRE_ALL_SUITES=1 the machine is expected to run everything: AssertionError instead."""
    if REQUIRE_ALL_SUITES:
        raise AssertionError(f"cannot run: {reason}\n(DDPRUN_REQUIRE_ALL_SUITES=1: this machine is expected to run "
                             "every suite; unset it to let the suite skip)")
    raise unittest.SkipTest(reason)


# The test hosts of scripts/test-cluster.sh have fixed names: whoever uses a set of them for a while (a netns
# test module, a Slurm test cluster) holds an exclusive flock on its file meanwhile (host_set.py).
CLUSTER_LOCK = host_set.CLUSTER_LOCK


def hold_cluster_lock(owner, timeout, path=None, what=None):
    """Waits (blocking flock, at most `timeout` s) for `path` (default CLUSTER_LOCK, the test hosts) and returns
    the open file: closing it releases the lock. Writes `owner` and this pid into the file so that a waiter can
    name the holder. Busy hosts are no reason to skip: after `timeout` s, AssertionError naming the holder and
    `what` was busy. Main thread only (the deadline is a SIGALRM)."""
    path = path or CLUSTER_LOCK
    what = what or f"the test hosts (set {host_set.HOST_SET})"
    lock = open(path, "a+")

    def expired(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeoutError:
        lock.seek(0)
        holder = lock.read().strip() or "nothing"
        lock.close()
        raise AssertionError(f"{what} stayed busy for {timeout} s: another process holds {path} (its last "
                             f"holder wrote: {holder})") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} ({owner}) since {time.strftime('%H:%M:%S')}\n")
    lock.flush()
    return lock


# How long a test process waits for its host set's lock (another checkout's run on this machine holds it for its
# modules, one after another). tests/integration/CMakeLists.txt adds this to a netns or Slurm module's CTest
# TIMEOUT, so that waiting for the hosts does not count against the module's own time.
LOCK_WAIT = int(os.environ.get("DDPRUN_TEST_LOCK_WAIT") or "1200")
_process_cluster_lock = None


def hold_cluster_lock_until_exit(owner, timeout=None):
    """hold_cluster_lock() once per process: the first call waits (at most `timeout`, default LOCK_WAIT s) and
    the lock is then held until the process exits, so a module of several classes waits once and keeps its host
    set between them. Prints how long it waited when that was over a second. Main thread only."""
    global _process_cluster_lock
    if _process_cluster_lock is None:
        started = time.monotonic()
        _process_cluster_lock = hold_cluster_lock(owner, LOCK_WAIT if timeout is None else timeout)
        waited = time.monotonic() - started
        if waited > 1:
            print(f"\n(waited {waited:.0f} s for the test hosts' lock {CLUSTER_LOCK})", file=sys.stderr, flush=True)
    return _process_cluster_lock


class SharedHostsTestCase(unittest.TestCase):
    """A test class that brings up the shared test hosts (network namespaces ddprun-h*: a netns cluster, a Slurm
    cluster on them) once for all its tests and takes them down after them, holding CLUSTER_LOCK meanwhile (and
    until the process exits: hold_cluster_lock_until_exit).
    Subclasses define bring_up() (raise, or skip_unless_required() when the machine cannot run it) and
    take_down(), and may define unavailable() (why this machine cannot run them, checked before the lock).
    Without root it skips (skip_unless_required: a failure under DDPRUN_REQUIRE_ALL_SUITES=1)."""
    LOCK_WAIT = LOCK_WAIT  # seconds to wait for another user of the hosts (another checkout's run)
    NEEDS_ROOT_TO = "create network namespaces"

    @classmethod
    def unavailable(cls):
        return None

    @classmethod
    def bring_up(cls):
        raise NotImplementedError

    @classmethod
    def take_down(cls):
        raise NotImplementedError

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            skip_unless_required(f"needs root to {cls.NEEDS_ROOT_TO} (run ctest as root)")
        reason = cls.unavailable()
        if reason:
            skip_unless_required(reason)
        if not os.access(DDPRUN, os.X_OK):
            raise RuntimeError(f"DDPRUN={DDPRUN} is not an executable; build ddprun or set DDPRUN")
        hold_cluster_lock_until_exit(f"{cls.__module__} with {PYTHON}", cls.LOCK_WAIT)
        cls.bring_up()

    @classmethod
    def tearDownClass(cls):
        cls.take_down()


# Run with the workers' interpreter where the workers run (a test host, a Slurm step): writes what a gloo worker
# depends on to <dir>/probe-<host name>.json. Arguments: dir, then host names to resolve.
WORKER_PROBE = r"""
import fcntl, json, os, socket, struct, sys
import torch

def interface_address(name):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError as e:
            return f"error: {e}"
    return socket.inet_ntoa(packed[20:24])

def resolve(name):
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        return f"error: {e}"

ifname = os.environ.get("GLOO_SOCKET_IFNAME")
info = {"pid": os.getpid(), "cwd": os.getcwd(), "host": socket.gethostname(), "torch": torch.__version__,
        "gloo_socket_ifname": ifname, "gloo_address": interface_address(ifname) if ifname else None,
        "resolved": {name: resolve(name) for name in sys.argv[2:]}, "env": {k: os.environ.get(k) for k in
        ("SLURM_TASK_PID", "SLURMD_NODENAME", "DDPRUN_IT_PROBE")}}
path = os.path.join(sys.argv[1], "probe-" + info["host"] + ".json")
with open(path + ".tmp", "w") as f:
    json.dump(info, f)
os.replace(path + ".tmp", path)
"""


def write_worker_probe(directory):
    """Writes WORKER_PROBE to <directory>/worker_probe.py; returns its path."""
    path = os.path.join(directory, "worker_probe.py")
    with open(path, "w") as f:
        f.write(WORKER_PROBE)
    return path


def check_worker_probe(test, info, host, address):
    """Asserts a WORKER_PROBE result: host name `host`, gloo's interface eth0 with `address`, and - where ctest
    asks for one (DDPRUN_IT_TORCH) - the expected torch version."""
    test.assertEqual(info["host"], host, info)
    test.assertEqual((info["gloo_socket_ifname"], info["gloo_address"]), ("eth0", address), info)
    if EXPECTED_TORCH:
        test.assertTrue(info["torch"].startswith(EXPECTED_TORCH + "."),
                        f"the workers' interpreter {PYTHON} imports torch {info['torch']}, not {EXPECTED_TORCH}")


def proc_stat(pid):
    """(state, ppid, pgrp, starttime) of a process from /proc/<pid>/stat, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may contain spaces and parentheses
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def is_gone(pid):
    """True when the process no longer runs: /proc/<pid> is absent, or it is a zombie waiting to be reaped."""
    st = proc_stat(pid)
    return st is None or st[0] in ("Z", "X")


def read_pidfile(path):
    """The pid in a fake_worker --pidfile once the file is complete, else None."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None


def read_json_file(path):
    """The parsed JSON file, or None while it is missing or only partly written."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def processes_with_token(token):
    """Live (non-zombie) pids whose environment contains DDPRUN_IT_TOKEN=<token>."""
    needle = f"DDPRUN_IT_TOKEN={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env and not is_gone(pid):
            found.append(pid)
    return found


class _Reader(threading.Thread):
    """Drains one pipe into memory so the child never blocks on a full pipe."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self._stream = stream
        self._chunks = []
        self._lock = threading.Lock()

    def run(self):
        while True:
            chunk = self._stream.read1(65536) if hasattr(self._stream, "read1") else self._stream.read(65536)
            if not chunk:
                break
            with self._lock:
                self._chunks.append(chunk)

    def data(self):
        with self._lock:
            return b"".join(self._chunks)


class Agent:
    """One running ddprun process with its stdout and stderr captured through pipes."""

    def __init__(self, args, env, cwd, program=None):
        self.args = [program or DDPRUN] + list(args)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
        self.pid = self.proc.pid
        self._out = _Reader(self.proc.stdout)
        self._err = _Reader(self.proc.stderr)
        self._out.start()
        self._err.start()

    def stdout(self):
        return self._out.data().decode(errors="replace")

    def stderr(self):
        return self._err.data().decode(errors="replace")

    def output(self):
        """stdout then stderr, for messages that may be on either (ddprun's own log lines go to stdout)."""
        return self.stdout() + self.stderr()

    def describe(self):
        return (f"command: {' '.join(self.args)}\n--- stdout (tail) ---\n{self.stdout()[-3000:]}\n"
                f"--- stderr (tail) ---\n{self.stderr()[-3000:]}")

    def wait(self, timeout, drain=True):
        """The exit code; AssertionError (with the output) when ddprun is still running after `timeout` s.
        drain: also wait (10 s at most) until the output pipes are closed, i.e. all output has been read; pass
        False when a survivor is expected to hold them open."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ddprun still running after {timeout} s\n{self.describe()}") from None
        if drain:
            self.join_readers(timeout=10)
        return rc

    def join_readers(self, timeout):
        # A surviving grandchild may still hold the pipes open; then the readers stop at cleanup.
        self._out.join(timeout)
        self._err.join(timeout)

    def signal(self, sig):
        self.proc.send_signal(sig)


class IntegrationTestCase(unittest.TestCase):
    """Temp dir per test, agents started through start(), and a tearDown that leaves no process behind."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun-it-")
        self.token = uuid.uuid4().hex
        self.worker = worker_for(self)  # for tests that run a training worker (training_worker())
        self.agents = []
        self.allow_leftovers = False  # a test that expects survivors (a known gap) sets it
        self.addCleanup(self._cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def start(self, args, env=None, unset=(), cwd=None, program=None):
        """Starts ddprun (or `program`, e.g. a torch launcher) with `args`; `env` adds variables and `unset`
        removes some from the inherited ones."""
        full = dict(os.environ)
        for name in unset:
            full.pop(name, None)
        full.update(env or {})
        full["DDPRUN_IT_TOKEN"] = self.token
        agent = Agent(args, full, cwd or self.tmp, program)
        self.agents.append(agent)
        return agent

    def run_agent(self, args, timeout=60, **kwargs):
        """start() then wait(): returns (agent, exit code)."""
        agent = self.start(args, **kwargs)
        return agent, agent.wait(timeout)

    def fake(self, *worker_args):
        """ddprun arguments that run fake_worker with `worker_args` (no Python)."""
        return ["--no_python", FAKE_WORKER] + [str(a) for a in worker_args]

    def rank_worker(self, rules):
        """ddprun arguments that run rank_worker.py with these rules (see that file)."""
        return ["--python", HOST_PYTHON, RANK_WORKER, json.dumps({"fake_worker": FAKE_WORKER, "rules": rules})]

    def job_results(self, agent, out, ranks, timeout):
        """Waits up to `timeout` s for `agent` to exit 0 and returns the rank<R>.json results its workers wrote
        into `out` (ddp_train.py's --out), in file name order, asserting that the ranks `ranks` wrote them."""
        rc = agent.wait(timeout)
        self.assertEqual(rc, 0, agent.describe())
        results = [read_json_file(p) for p in sorted(glob.glob(os.path.join(out, "rank*.json")))]
        self.assertEqual([r["rank"] for r in results], list(ranks), agent.describe())
        return results

    def wait_pidfiles(self, pattern, count, timeout=30):
        """Waits for pidfiles pattern.format(lr) for lr in range(count); returns their pids."""
        paths = [pattern.format(lr) for lr in range(count)]

        def ready():
            pids = [read_pidfile(p) for p in paths]
            return pids if all(pids) else None

        return wait_until(ready, timeout, f"pidfiles {paths}")

    def assert_gone(self, pids, timeout, what):
        try:
            wait_until(lambda: all(is_gone(p) for p in pids), timeout, what)
        except AssertionError:
            alive = {p: proc_stat(p) for p in pids if not is_gone(p)}
            raise AssertionError(f"{what}: still alive after {timeout} s: {alive}") from None

    def live_processes(self):
        return processes_with_token(self.token)

    def _cleanup(self):
        killed_agent = False
        for agent in self.agents:
            if agent.proc.poll() is None:
                agent.proc.kill()
                killed_agent = True
            try:
                agent.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        leftovers = set()
        deadline = time.monotonic() + 15
        while True:
            pids = self.live_processes()
            if not pids or time.monotonic() > deadline:
                break
            leftovers.update(pids)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for agent in self.agents:
            agent.join_readers(timeout=5)
            for stream in (agent.proc.stdout, agent.proc.stderr):
                stream.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        still = self.live_processes()
        if still:
            raise AssertionError(f"cleanup could not kill processes {still}")
        # Every agent ended on its own (or by the test's signal): then nothing it started may outlive it.
        if leftovers and not killed_agent and not self.allow_leftovers:
            raise AssertionError(f"processes outlived ddprun (killed by the test's cleanup): {sorted(leftovers)}")
