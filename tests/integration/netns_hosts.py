"""Test hosts for the elastic tests: network namespaces with their own IPv4 addresses, and ddprun agents on them.

scripts/test-cluster.sh makes hosts ddprun-h1..h4 (10.99.0.1..4 on bridge ddprun-br0; in host set S of
DDPRUN_TEST_HOSTS, which ctest gives each module, ddprun-sSh1..h4 at 10.99.S.1..4: host_set.py). HostsTestCase
recreates them for its module (test-cluster.sh down, then up), so nothing an interrupted earlier run left on them is in
the way, and leaves no process on any host after each test. It needs root and network namespaces: skipped
with the reason otherwise (ddprun_testlib.skip_unless_required: a failure under DDPRUN_REQUIRE_ALL_SUITES=1);
anything else that keeps the hosts from coming up, or hosts still busy after LOCK_WAIT, is a failure. Hosts are
taken under an flock (ddprun_testlib.SharedHostsTestCase, which test_slurm.py shares). Environment (set by tests/integration/CMakeLists.txt):
DDPRUN = the ddprun executable, REPO = the source tree (defaults to the one this file is in); DDPRUN_IT_KEEP=1
keeps each test's directory (agent logs). The hosts share the file system, so checkpoints and result files
live in one temporary directory. Standard library only; run with /usr/bin/python3 (torch).

The training worker of start_training(): scripts/examples/ddp_train.py with real torch (the module's: 1.13, or
2.6 in a .torch26 variant) for a test marked ddprun_testlib.torch_subject, else the light worker
tests/integration/light_train.py (the same options and outputs, no torch); worker= chooses one for a call.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

import ddprun_testlib
import host_set
from ddprun_testlib import PYTHON, skip_unless_required  # noqa: F401 (PYTHON: for modules that import it from here)

REPO = os.environ.get("REPO") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDPRUN = os.environ.get("DDPRUN") or os.path.join(REPO, "build", "launcher", "ddprun")
CLUSTER = os.path.join(REPO, "scripts", "test-cluster.sh")
TRAIN = os.path.join(REPO, "scripts", "examples", "ddp_train.py")

HOSTS = 4
NPROC = 2  # workers per host: torch workers are slow to start on a 2-core machine
# Small timeouts so that a node's loss is seen in ~3 s and a round closes 2 s after MIN nodes joined.
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=90"
JOB_TIMEOUT = 150  # seconds: bound for one elastic job (it takes ~30-60 s on an idle 2-core machine)
ROUND_LINE = re.compile(r"\] ddprun \S+ info: round (\d+): node (\d+)/(\d+), ranks \d+\.\.\d+ of (\d+),")


def address(host):
    return host_set.host_address(host)


def cluster(*args, check=True):
    """Runs scripts/test-cluster.sh; returns the CompletedProcess (output captured)."""
    done = subprocess.run(["bash", CLUSTER, *map(str, args)], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if check and done.returncode != 0:
        command = " ".join(map(str, args))
        raise RuntimeError(f"test-cluster.sh {command} failed ({done.returncode}):\n{done.stdout}")
    return done


def host_pids(host):
    """The processes running in host's network namespace."""
    done = subprocess.run(["ip", "netns", "pids", host_set.host_namespace(host)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    return [int(p) for p in done.stdout.split()]


def kill_host_processes(host):
    for pid in host_pids(host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def rounds_of(log):
    """[(round, node count, world size)] for every round the agent ran workers in, in order."""
    return [(int(m[1]), int(m[3]), int(m[4])) for m in ROUND_LINE.finditer(log)]


def wait_until(predicate, timeout, what, describe=lambda: ""):
    return ddprun_testlib.wait_until(predicate, timeout, what, describe, interval=0.1)


class HostAgent:
    """One ddprun agent (or `program`, e.g. torch's launcher: PYTHON) running on a test host; stdout and stderr go
    to a log file; `env` adds variables."""

    def __init__(self, host, args, log_path, program=None, env=None):
        self.host = host
        self.log_path = log_path
        self.started = time.monotonic()
        # gloo's interface: the host's 10.99.0.x address
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", **(env or {}))
        with open(log_path, "wb") as log:
            # test-cluster.sh execs all the way down: this pid is ddprun's.
            self.proc = subprocess.Popen(["bash", CLUSTER, "exec", str(host), program or DDPRUN, *args],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def describe(self):
        return f"--- host {self.host} agent log (tail) ---\n{self.log()[-4000:]}"

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=max(1, timeout))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ddprun on host {self.host} still running after {timeout:.0f} s\n"
                                 f"{self.describe()}") from None


class HostsTestCase(ddprun_testlib.SharedHostsTestCase):
    """Fresh hosts for the module, a temporary directory per test, and no process left on any host after it."""

    @classmethod
    def bring_up(cls):
        """Fresh hosts: exit 77 of test-cluster.sh (no namespaces here) skips, any other failure fails."""
        down = cluster("down", check=False)  # whatever an interrupted earlier run left on the hosts goes
        up = down if down.returncode == 77 else cluster("up", HOSTS, check=False)
        if up.returncode == 77:
            skip_unless_required(f"no network namespaces here: {up.stdout.strip()}")
        if down.returncode != 0 or up.returncode != 0:
            cluster("down", check=False)
            raise AssertionError(f"test-cluster.sh down/up {HOSTS} failed:\n{down.stdout}\n{up.stdout}")

    @classmethod
    def take_down(cls):
        cluster("down", check=False)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun-netns-")
        self.agents = []
        self.addCleanup(self._cleanup)
        self.run_id = f"netns-{uuid.uuid4().hex[:8]}"
        # The training worker of start_training(): real torch where the test is marked torch_subject, else
        # the light worker (ddprun_testlib.torch_subject, docs/testing.md "Which worker").
        self.worker = ddprun_testlib.worker_for(self)
        # start_training()'s --rdzv_conf; a test may set its own (e.g. a longer heartbeat timeout where a node's
        # loss is not what it tests and torch workers load the machine).
        self.rdzv_conf = RDZV_CONF

    def _cleanup(self):
        for agent in self.agents:
            if agent.proc.poll() is None:
                agent.proc.kill()
            agent.proc.wait(timeout=30)
        for host in range(1, HOSTS + 1):
            kill_host_processes(host)
        for host in range(1, HOSTS + 1):
            wait_until(lambda: not host_pids(host), 15, f"processes on host {host} to die")
        if os.environ.get("DDPRUN_IT_KEEP"):
            print(f"\nkept {self.tmp}", flush=True)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def start_training(self, host, port, steps, nnodes="2:4", endpoint=None, extra=(), agent_args=(), worker=None):
        """ddp_train.py (or the light worker with its options: `worker` "torch" or "light", default self.worker)
        under ddprun on `host`; the endpoint is host 1's address unless given. `steps` bounds the training;
        stop_training() ends it sooner, once the test has seen what it waits for. `extra` goes to the script,
        `agent_args` to ddprun."""
        python, script, env = ddprun_testlib.training_worker(worker or self.worker, TRAIN)
        args = ["--nnodes", nnodes, "--nproc_per_node", str(NPROC), "--rdzv_backend", "c10d",
                "--rdzv_endpoint", endpoint or f"{address(1)}:{port}", "--rdzv_id", self.run_id,
                "--rdzv_conf", self.rdzv_conf,
                "--max_restarts", "3", "--tee", "3", "--log_dir", self.path(f"logs-h{host}"), *agent_args,
                "--python", python, script, "--steps", str(steps), "--hidden", "32", "--batch", "16",
                "--log-every", "10", "--save-every", "10", "--checkpoint", self.path("checkpoint.pt"),
                "--out", self.path("out"), "--stop-file", self.path("stop"), *extra]
        agent = HostAgent(host, args, self.path(f"agent-h{host}.log"), env=env)
        self.agents.append(agent)
        return agent

    def stop_training(self):
        """Every rank of the running round stops after its next --stop-every steps (ddp_train.py --stop-file)."""
        with open(self.path("stop"), "w"):
            pass

    def describe_all(self):
        return "\n".join(a.describe() for a in self.agents)

    def wait_for_training(self, agent, nodes):
        """Waits until `agent` (or one of a list of agents) runs a round of `nodes` nodes in which rank 0 (on its
        host) logged a step."""
        def on(one):
            log = one.log()
            last = list(ROUND_LINE.finditer(log))[-1:]
            return last and int(last[0][3]) == nodes and re.search(r"step \d+/\d+ loss", log[last[0].end():])

        def training():
            return any(on(one) for one in (agent if isinstance(agent, list) else [agent]))

        wait_until(training, 90, f"training steps in a round of {nodes} nodes", self.describe_all)

    def assert_results(self, world_size):
        """Every rank wrote its result in the final round; all parameter checksums agree."""
        files = sorted(glob.glob(self.path("out", "rank*.json")))
        results = []
        for f in files:
            with open(f) as fh:
                results.append(json.load(fh))
        self.assertEqual(sorted(r["rank"] for r in results), list(range(world_size)),
                         f"result files: {files}\n{self.describe_all()}")
        self.assertTrue(all(r["world_size"] == world_size and r["identical"] for r in results), results)
        self.assertEqual(len({r["checksum"] for r in results}), 1, f"checksums differ: {results}")
        self.assertEqual(len({r["attempt"] for r in results}), 1, results)
        return results

    def assert_exit_zero(self, agents):
        deadline = time.monotonic() + JOB_TIMEOUT
        for agent in agents:
            rc = agent.wait(deadline - time.monotonic())
            self.assertEqual(rc, 0, f"ddprun on host {agent.host} exited {rc}\n{self.describe_all()}")
