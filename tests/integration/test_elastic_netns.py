"""Elastic rendezvous (c10d backend) on real hosts: network namespaces with their own IPv4 addresses.

scripts/test-cluster.sh makes hosts ddprun-h1..h4 (10.99.0.1..4 on bridge ddprun-br0); every agent runs on its
own host and the endpoint is host 1's address, so host 1's agent hosts the store (is_host detection) and the
others reach it over the bridge. The workers are scripts/examples/ddp_train.py (real gloo DDP, CPU). Cases:
  - a node dies (its agent is SIGKILLed mid-run): the survivors re-form with 2 nodes, resume from the
    checkpoint and finish; nothing of the dead host survives;
  - a node arrives mid-run: the next round has 4 nodes (8 workers) and every agent finishes;
  - an endpoint nobody serves: exit code 4 soon after join_timeout, with a message naming the endpoint;
  - the workers' interpreter on a host (with the torch 2.6 root: scripts/torch26-root.sh `run` under `ip netns
    exec`) keeps its pid and directory and sees the host's name and eth0 address, and the expected torch.

Needs root and network namespaces: skipped with the reason otherwise (ddprun_testlib.skip_unless_required: a
failure under DDPRUN_REQUIRE_ALL_SUITES=1). Anything else that keeps the hosts from coming up, or hosts still
busy after LOCK_WAIT, is a failure. The hosts are recreated for the module (test-cluster.sh down, then up), so
nothing an interrupted earlier run left on them is in the way. Environment (set by
tests/integration/CMakeLists.txt): DDPRUN = the ddprun executable, REPO = the source tree (defaults to the one
this file is in); DDPRUN_IT_KEEP=1 keeps each test's directory (agent logs). Only 10.99.0.x addresses are
used. The hosts share the file system, so the checkpoint and the result files live in one temporary directory.
Standard library only; run with /usr/bin/python3 (torch). Hosts are taken under an flock
(ddprun_testlib.hold_cluster_lock).
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
import unittest
import uuid

import ddprun_testlib
from ddprun_testlib import PYTHON, skip_unless_required

REPO = os.environ.get("REPO") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDPRUN = os.environ.get("DDPRUN") or os.path.join(REPO, "build", "launcher", "ddprun")
CLUSTER = os.path.join(REPO, "scripts", "test-cluster.sh")
TRAIN = os.path.join(REPO, "scripts", "examples", "ddp_train.py")

HOSTS = 4
NPROC = 2  # workers per host: torch workers are slow to start on a 2-core machine
# Small timeouts so that a node's loss is seen in ~3 s and a round closes 2 s after MIN nodes joined.
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=90"
JOB_TIMEOUT = 150  # seconds: bound for one elastic job (it takes ~30-60 s on an idle 2-core machine)
LOCK_WAIT = 240  # seconds to wait for another user of the hosts (another build's run, a Slurm test cluster)
ROUND_LINE = re.compile(r"\] ddprun \S+ info: round (\d+): node (\d+)/(\d+), ranks \d+\.\.\d+ of (\d+),")


def address(host):
    return f"10.99.0.{host}"


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
    done = subprocess.run(["ip", "netns", "pids", f"ddprun-h{host}"], stdout=subprocess.PIPE,
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
    """One ddprun agent running on a test host; stdout and stderr go to a log file."""

    def __init__(self, host, args, log_path):
        self.host = host
        self.log_path = log_path
        self.started = time.monotonic()
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0")  # gloo's interface: the host's 10.99.0.x address
        with open(log_path, "wb") as log:
            # test-cluster.sh execs all the way down: this pid is ddprun's.
            self.proc = subprocess.Popen(["bash", CLUSTER, "exec", str(host), DDPRUN, *args],
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


class ElasticOnHosts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            skip_unless_required("needs root to create network namespaces (run ctest as root)")
        if not os.access(DDPRUN, os.X_OK):
            raise RuntimeError(f"DDPRUN={DDPRUN} is not an executable; build ddprun or set DDPRUN")
        cls.lock = ddprun_testlib.hold_cluster_lock(f"{__name__} with {PYTHON}", LOCK_WAIT)
        try:
            cls._up()
        except BaseException:
            cls.lock.close()
            raise

    @classmethod
    def _up(cls):
        """Fresh hosts: exit 77 of test-cluster.sh (no namespaces here) skips, any other failure fails."""
        down = cluster("down", check=False)  # whatever an interrupted earlier run left on the hosts goes
        up = down if down.returncode == 77 else cluster("up", HOSTS, check=False)
        if up.returncode == 77:
            skip_unless_required(f"no network namespaces here: {up.stdout.strip()}")
        if down.returncode != 0 or up.returncode != 0:
            cluster("down", check=False)
            raise AssertionError(f"test-cluster.sh down/up {HOSTS} failed:\n{down.stdout}\n{up.stdout}")

    @classmethod
    def tearDownClass(cls):
        cluster("down", check=False)
        cls.lock.close()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun-netns-")
        self.agents = []
        self.addCleanup(self._cleanup)
        self.run_id = f"netns-{uuid.uuid4().hex[:8]}"

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

    def start_training(self, host, port, steps):
        args = ["--nnodes", "2:4", "--nproc_per_node", str(NPROC), "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"{address(1)}:{port}", "--rdzv_id", self.run_id, "--rdzv_conf", RDZV_CONF,
                "--max_restarts", "3", "--tee", "3", "--log_dir", self.path(f"logs-h{host}"),
                "--python", PYTHON, TRAIN, "--steps", str(steps), "--hidden", "32", "--batch", "16",
                "--log-every", "10", "--save-every", "10", "--checkpoint", self.path("checkpoint.pt"),
                "--out", self.path("out")]
        agent = HostAgent(host, args, self.path(f"agent-h{host}.log"))
        self.agents.append(agent)
        return agent

    def describe_all(self):
        return "\n".join(a.describe() for a in self.agents)

    def wait_for_training(self, agent, nodes):
        """Waits until `agent` runs a round of `nodes` nodes in which rank 0 (on its host) logged a step."""
        def training():
            log = agent.log()
            last = list(ROUND_LINE.finditer(log))[-1:]
            return last and int(last[0][3]) == nodes and re.search(r"step \d+/\d+ loss", log[last[0].end():])

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

    def test_survivors_reform_without_a_killed_node(self):
        agents = [self.start_training(h, 29401, steps=600) for h in (1, 2, 3)]
        self.wait_for_training(agents[0], nodes=3)
        wait_until(lambda: os.path.exists(self.path("checkpoint.pt")), 60, "the first checkpoint",
                   self.describe_all)
        victim = agents[2]
        self.assertIsNone(victim.proc.poll(), victim.describe())
        self.assertGreater(len(host_pids(3)), 1, "host 3 should run its agent and workers")
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        # The workers of a SIGKILLed agent must not survive it (they would hold the round's collectives).
        wait_until(lambda: not host_pids(3), 15, "host 3's workers to die with their agent",
                   lambda: f"left on host 3: {host_pids(3)}")
        self.assert_exit_zero(agents[:2])
        final = set()
        for agent in agents[:2]:
            log = agent.log()
            rounds = rounds_of(log)
            # Exactly one re-form: the last round with host 3, then one round of the 2 survivors (a spurious
            # extra round would mean a live node was declared dead, or a stale stop ended the new round).
            self.assertGreaterEqual(len(rounds), 2, agent.describe())
            self.assertEqual(rounds[-2][1:], (3, 3 * NPROC), f"rounds {rounds}\n{agent.describe()}")
            self.assertEqual(rounds[-1], (rounds[-2][0] + 1, 2, 2 * NPROC),
                             f"rounds {rounds}\n{agent.describe()}")
            final.add(rounds[-1][0])
            self.assertIn("membership changed", log, agent.describe())
            # A lost node is not a failure of the job: no restart is counted.
            self.assertNotIn("restarting the worker group", log, agent.describe())
        self.assertRegex(agents[0].log(), r"resumed from .*checkpoint\.pt at step [1-9]\d*",
                         agents[0].describe())
        results = self.assert_results(2 * NPROC)
        self.assertEqual({results[0]["attempt"]}, final, results)

    def test_new_node_joins_the_next_round(self):
        agents = [self.start_training(h, 29402, steps=600) for h in (1, 2, 3)]
        self.wait_for_training(agents[0], nodes=3)
        agents.append(self.start_training(4, 29402, steps=600))
        self.assert_exit_zero(agents)
        final = set()
        for agent in agents:
            rounds = rounds_of(agent.log())
            # The newcomer's arrival ends the running round; the next one has all 4 nodes and is the last.
            self.assertTrue(rounds, agent.describe())
            self.assertEqual(rounds[-1][1:], (4, 4 * NPROC), f"rounds {rounds}\n{agent.describe()}")
            final.add(rounds[-1][0])
            self.assertNotIn("restarting the worker group", agent.log(), agent.describe())
        self.assertEqual(len(final), 1, f"the agents' last rounds differ: {final}\n{self.describe_all()}")
        self.assertEqual(len(rounds_of(agents[3].log())), 1, agents[3].describe())
        results = self.assert_results(4 * NPROC)
        self.assertEqual({results[0]["attempt"]}, final, results)
        self.assertGreaterEqual(results[0]["attempt"], 1, results)

    def test_workers_interpreter_on_a_host_sees_the_host(self):
        # What a gloo worker on host 2 depends on: test-cluster.sh exec runs the interpreter (with torch 2.6:
        # torch26-root.sh `run`, a private mount namespace and a chroot) as the very process it started, in its
        # directory, with the host's name and network (eth0 = 10.99.0.2) and the expected torch.
        probe = ddprun_testlib.write_worker_probe(self.tmp)
        with open(self.path("probe.log"), "wb") as log:
            proc = subprocess.Popen(["bash", CLUSTER, "exec", "2", PYTHON, probe, self.tmp],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp,
                                    env=dict(os.environ, GLOO_SOCKET_IFNAME="eth0", DDPRUN_IT_PROBE="netns"))
            try:
                rc = proc.wait(timeout=120)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        with open(self.path("probe.log"), errors="replace") as f:
            output = f.read()
        self.assertEqual(rc, 0, output)
        info = ddprun_testlib.read_json_file(self.path("probe-ddprun-h2.json"))
        self.assertIsNotNone(info, output)
        ddprun_testlib.check_worker_probe(self, info, "ddprun-h2", address(2))
        self.assertEqual(info["pid"], proc.pid, f"not the process that test-cluster.sh exec started: {info}")
        self.assertEqual(info["cwd"], self.tmp, info)
        self.assertEqual(info["env"]["DDPRUN_IT_PROBE"], "netns", info)

    def test_unreachable_endpoint_exits_4_naming_it(self):
        endpoint = f"{address(200)}:29403"  # inside the hosts' subnet, but no host has that address
        agent = HostAgent(2, ["--nnodes", "1:2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                              "--rdzv_endpoint", endpoint, "--rdzv_id", self.run_id,
                              "--rdzv_conf", "join_timeout=5", "--python", PYTHON, TRAIN],
                          self.path("agent-unreachable.log"))
        self.agents.append(agent)
        rc = agent.wait(60)
        elapsed = time.monotonic() - agent.started
        self.assertEqual(rc, 4, agent.describe())
        self.assertIn(endpoint, agent.log(), agent.describe())
        self.assertLess(elapsed, 5 + 10, f"join_timeout=5 but ddprun took {elapsed:.1f} s\n"
                                         f"{agent.describe()}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
