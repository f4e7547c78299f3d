"""Rendezvous over a real 3-member etcd cluster on network-namespace hosts: torch's own launcher, ddprun, and both
in one job.

The etcd cluster (tests/integration/etcd_cluster.py) has one member on each of hosts 1..3 (10.99.0.N:2379, v2
API on); every launcher runs on its own host (tests/integration/netns_hosts.py), the workers are
scripts/examples/ddp_train.py (gloo DDP on CPUs, 2 per host). The hosts get resolvable names (test-cluster.sh
`names`): torch's agents publish their host name as MASTER_ADDR. Torch's launcher is the workers' own
(`PYTHON -m torch.distributed.run`: 1.13 on the host, 2.6 in the .torch26 variant), with `--redirects 1 --tee 1`
(Debian's torch 1.13.1 on Python 3.11 crashes with the default 0/0: IntFlag iteration) and
`--monitor_interval 0.1`. A job's ranks must be 0..W-1 once each, with world size W and identical parameters
on every rank (NetnsHosts.assert_results).

EtcdClusterItself - what the other tests rely on: a new leader ~2-4 s after the leader's SIGKILL (election
timeout 1 s), the old member rejoining with its data, TLS refusing a stranger and a client of another CA,
nothing left after stop().
TorchrunOnEtcd - torch alone, on both of torch's etcd backends:
  - `etcd` (EtcdRendezvousHandler, the legacy protocol), 2 and 3 agents, and 2 agents on the TLS cluster;
  - `etcd-v2` (DynamicRendezvousHandler over EtcdRendezvousBackend), 3 agents;
  - the etcd leader SIGKILLed mid-training, once another member, once the member --rdzv_endpoint names (torch's
    client learned all members from it and fails over): the job finishes;
  - etcd without the v2 API: torchrun exits 1 with "etcd.EtcdException: Bad response : 404 page not found".
DdprunOnEtcd - ddprun (issue 28: --rdzv_backend etcd / etcd-v2, which land in parallel with these tests):
  (a) a mixed job: torchrun on host 1, ddprun on hosts 2 and 3, on `etcd`;
  (b) ddprun alone on `etcd` and on `etcd-v2` with the list of all three endpoints;
  (c) the etcd leader SIGKILLed mid-training: the job finishes;
  (d) the leader SIGKILLed while two agents wait for a third, which joins after the kill: the job forms;
  (e) 2 of 3 members dead before the start: exit non-zero within about read_timeout, naming the endpoints;
  (f) a TLS cluster with client certificates: trains; with the wrong CA, exits non-zero naming the certificate;
  (g) etcd-v2 with --nnodes 2:3: a node lost, a node joining;
  (h) etcd without the v2 API (3.4's default): both backends exit non-zero and say so.
Workers: torch's launcher, the mixed job and ddprun alone on etcd-v2 run real DDP workers with every torch version
(torch's own launcher; torch's ranks on a store their rank 0 hosts, TORCHELASTIC_USE_AGENT_STORE=False); ddprun
alone on etcd and everything in test_etcd_recovery_netns.py run the light worker (light_train.py) once, whose
rank 0 listens on MASTER_PORT there as torch's does.
Torch's etcd-v2 was broken in 2.3-2.5 (pytorch #123714, #132950: "etcd.EtcdKeyNotFound: Key not found :
/torch/elastic/store" when a node reads the master address before rank 0 wrote any store key): Debian's 1.13.1
(no such read) and 2.6.0 (EtcdStore._try_wait_get catches EtcdKeyNotFound) both train here.
"""
import re
import subprocess
import time
import unittest

import ddprun_testlib
from ddprun_testlib import EXPECTED_TORCH, PYTHON, torch_subject
from etcd_cluster import EtcdCluster
from netns_hosts import NPROC, ROUND_LINE, TRAIN, HostAgent, HostsTestCase, address, cluster, wait_until

TORCH_113 = not (EXPECTED_TORCH or "").startswith("2.")
JOB_TIMEOUT = 180  # seconds for one short job: 4-6 workers import torch on a 2-core machine
STEPS = 30  # a job that is not stopped by the test trains this many steps (a few seconds)
# ddprun's rendezvous settings per backend, test-sized, in the keys torch's backend of that name reads:
# etcd (EtcdRendezvousHandler) knows timeout, last_call_timeout and the TLS keys; etcd-v2 the dynamic
# rendezvous' keys (as test_elastic_netns gives c10d: a lost node seen in ~3 s) plus read_timeout and TLS keys.
# A round of at least MIN nodes closes 1 s after the last one joined.
DDPRUN_CONF = {"etcd": "last_call_timeout=1,timeout=90",
               "etcd-v2": "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=90"}
# Test-sized timeouts for the cases that must fail: every request to etcd, and the whole rendezvous.
QUICK_FAIL_CONF = {"etcd": "read_timeout=5,timeout=5", "etcd-v2": "read_timeout=5,join_timeout=5"}

HOST_NAMES = [f"ddprun-h{h}" for h in (1, 2, 3, 4)]
# Without an agent store (torch's etcd backends: TORCHELASTIC_USE_AGENT_STORE=False) rank 0's worker hosts the
# job's TCPStore through init_process_group's env://, which in torch 2.x passes use_libuv=(USE_LIBUV, default
# "1") explicitly: Debian 13's torch 2.6, built without libuv, then fails with "use_libuv was requested but
# PyTorch was build without libuv support" (scripts/torch26/ddprun_torch_no_libuv.py only changes the default).
LAUNCHER_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **({} if TORCH_113 else {"USE_LIBUV": "0"})}


def merged_conf(*confs):
    """"k=v,..." strings merged left to right (a later value replaces an earlier one's), as one "k=v,..." string."""
    merged = {}
    for conf in confs:
        for item in filter(None, conf.split(",")):
            key, _, value = item.partition("=")
            merged[key] = value
    return ",".join(f"{k}={v}" for k, v in merged.items())


class EtcdHostsTestCase(HostsTestCase):
    """HostsTestCase with resolvable host names, an etcd cluster per test (etcd()), and launchers of both kinds."""

    @classmethod
    def bring_up(cls):
        # torch's etcd backends import python-etcd: the host has python3-etcd, the torch 2.6 root gets it from
        # scripts/torch26-root.sh's package list (an older root lacks it: rebuilt when its stamp differs).
        probe = subprocess.run([PYTHON, "-c", "import etcd"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=120)
        if probe.returncode != 0:
            raise AssertionError(f"{PYTHON} cannot import etcd (python3-etcd), which torch's etcd rendezvous "
                                 f"needs; for the torch 2.6 root run scripts/torch26-root.sh:\n{probe.stdout}")
        super().bring_up()
        cluster("names", *HOST_NAMES)  # torch's agents publish socket.getfqdn() as the workers' MASTER_ADDR

    def etcd(self, **options):
        """A started 3-member cluster on hosts 1..3 (EtcdCluster options: tls, v2); stopped after the test, first
        of all clean-ups (so that no etcd process is ever left, whatever the test did)."""
        etcd = EtcdCluster(self.path("etcd"), **options)
        self.addCleanup(etcd.stop)
        began = time.monotonic()
        etcd.start()
        print(f"\n  etcd cluster healthy in {time.monotonic() - began:.1f} s (tls={etcd.tls}, v2={etcd.v2})",
              flush=True)
        self.cluster = etcd
        return etcd

    def train_args(self, steps=STEPS, script=TRAIN):
        return [script, "--steps", str(steps), "--hidden", "32", "--batch", "16", "--log-every", "10",
                "--save-every", "10", "--checkpoint", self.path("checkpoint.pt"), "--out", self.path("out"),
                "--stop-file", self.path("stop")]

    def torchrun(self, host, backend, nnodes, endpoint=None, conf=None, steps=STEPS):
        """torch's launcher (the workers' torch) on `host`; the endpoint is host 1's etcd unless given."""
        args = ["-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc_per_node", str(NPROC),
                "--rdzv_backend", backend, "--rdzv_endpoint", endpoint or f"{address(1)}:2379",
                "--rdzv_id", self.run_id, "--max_restarts", "0", "--monitor_interval", "0.1",
                "--redirects", "1", "--tee", "1", "--log_dir", self.path(f"logs-h{host}")]
        if conf:
            args += ["--rdzv_conf", conf]
        agent = HostAgent(host, args + self.train_args(steps), self.path(f"torchrun-h{host}.log"), program=PYTHON,
                          env=dict(LAUNCHER_ENV, LOGLEVEL="INFO"))
        self.agents.append(agent)
        return agent

    def ddprun(self, host, backend, nnodes, endpoint=None, conf="", steps=STEPS, max_restarts=3, flags=(),
               train=()):
        """ddprun on `host`, running the test's worker (self.worker: ddp_train.py or the light worker); the
        endpoint is all three members unless given; `conf` is merged into DDPRUN_CONF[backend]; `flags` go to
        ddprun, `train` to the training script."""
        python, script, env = ddprun_testlib.training_worker(self.worker, TRAIN)
        args = ["--nnodes", str(nnodes), "--nproc_per_node", str(NPROC), "--rdzv_backend", backend,
                "--rdzv_endpoint", endpoint or self.cluster.endpoints(), "--rdzv_id", self.run_id,
                "--rdzv_conf", merged_conf(DDPRUN_CONF[backend], conf),
                "--max_restarts", str(max_restarts), "--tee", "3", "--log_dir", self.path(f"logs-h{host}"),
                *flags, "--python", python, *self.train_args(steps, script), *train]
        agent = HostAgent(host, args, self.path(f"ddprun-h{host}.log"), env=dict(LAUNCHER_ENV, **env))
        self.agents.append(agent)
        return agent

    def assert_job(self, agents, world_size):
        """Every agent exits 0 (the first non-zero exit fails at once); the ranks are 0..world_size-1 once each,
        parameters identical everywhere."""
        def ended():
            failed = [a for a in agents if a.proc.poll() not in (None, 0)]
            if failed:
                raise AssertionError(f"the agent on host {failed[0].host} exited {failed[0].proc.returncode}\n"
                                     f"{self.describe_all()}")
            return all(a.proc.poll() == 0 for a in agents)

        wait_until(ended, JOB_TIMEOUT, "every agent to exit 0", self.describe_all)
        return self.assert_results(world_size)

    def assert_fails(self, agent, timeout):
        """The agent exits non-zero within `timeout` s; returns (exit code, seconds, its log)."""
        rc = agent.wait(timeout)
        elapsed = time.monotonic() - agent.started
        self.assertNotEqual(rc, 0, agent.describe())
        return rc, elapsed, agent.log()

    def running(self, predicate):
        """predicate, failing at once (not at the wait's deadline) when an agent of the test has exited."""
        def check():
            ended = [a for a in self.agents if a.proc.poll() is not None and not getattr(a, "killed", False)]
            if ended:
                raise AssertionError(f"ddprun/torchrun on host {ended[0].host} exited {ended[0].proc.returncode} "
                                     f"while the test waited\n{self.describe_all()}")
            return predicate()
        return check

    def steps_logged(self):
        """Training steps rank 0 logged so far (on whichever host it runs)."""
        return max(len(re.findall(r"step \d+/\d+ loss", a.log())) for a in self.agents)

    def wait_steps(self, count=1):
        """Waits until rank 0 logged `count` training steps (every --log-every steps: 10)."""
        wait_until(self.running(lambda: self.steps_logged() >= count), 120, f"{count} logged training step(s)",
                   self.describe_all)

    def wait_for_training(self, agent, nodes):
        """HostsTestCase.wait_for_training, failing at once when an agent exits."""
        def training():
            log = agent.log()
            last = list(ROUND_LINE.finditer(log))[-1:]
            return last and int(last[0][3]) == nodes and re.search(r"step \d+/\d+ loss", log[last[0].end():])

        wait_until(self.running(training), 90, f"training steps in a round of {nodes} nodes", self.describe_all)

    def describe_all(self):
        text = "\n".join(a.describe() for a in self.agents)
        return text + ("\n" + self.cluster.describe() if getattr(self, "cluster", None) else "")

    def rendezvous_keys(self):
        """Every etcd v2 key (recursive listing from a live member) whose path or value mentions this run."""
        etcd = self.cluster
        for i in etcd.members_alive():
            try:
                status, body = etcd.request(i, "/v2/keys/?recursive=true&quorum=false")
            except (OSError, ValueError):
                continue
            if status == 200 and isinstance(body, dict):
                found = {}

                def walk(node):
                    for child in node.get("nodes", []):
                        walk(child)
                    if "value" in node and (self.run_id in node["key"] or self.run_id in node["value"]):
                        found[node["key"]] = node["value"]

                walk(body.get("node", {}))
                return found
        return {}


@torch_subject
class TorchrunOnEtcd(EtcdHostsTestCase):
    """torch's own launcher on torch's etcd backends: what ddprun's etcd backends must interoperate with."""

    def run_torch_job(self, backend, hosts, conf=None):
        agents = [self.torchrun(h, backend, len(hosts), conf=conf) for h in hosts]
        return self.assert_job(agents, len(hosts) * NPROC)

    def test_etcd_backend_two_agents(self):
        self.etcd()
        self.run_torch_job("etcd", (1, 2))

    def test_etcd_backend_three_agents(self):
        self.etcd()
        self.run_torch_job("etcd", (1, 2, 3))
        # The legacy protocol's state: /torchelastic/p2p/run_<id>/rdzv/active_version, final with 3 participants.
        keys = self.rendezvous_keys()
        self.assertTrue(any(k.endswith("/rdzv/active_version") for k in keys), keys)

    def test_etcd_backend_over_tls(self):
        etcd = self.etcd(tls=True)
        self.run_torch_job("etcd", (1, 2), conf=f"protocol=https,cacert={etcd.ca_file},cert={etcd.client_cert},"
                                                f"key={etcd.client_key}")

    def test_etcd_v2_backend_three_agents(self):
        self.etcd()
        self.run_torch_job("etcd-v2", (1, 2, 3), conf="last_call_timeout=1,read_timeout=10")

    def test_etcd_without_the_v2_api_fails_both_backends(self):
        # etcd 3.4 serves only the v3 API unless --enable-v2 (3.6 removed v2): python-etcd's requests get 404s.
        self.etcd(v2=False)
        agents = {backend: self.torchrun(host, backend, 2, conf="read_timeout=5,timeout=10,join_timeout=10")
                  for host, backend in ((1, "etcd"), (2, "etcd-v2"))}
        for backend, agent in agents.items():
            rc, elapsed, log = self.assert_fails(agent, 90)
            # What torch says (1.13 and 2.6): python-etcd's "etcd.EtcdException: Bad response : 404 page not
            # found"; etcd-v2 wraps it in RendezvousConnectionError "The connection to etcd has failed".
            self.assertIn("Bad response : 404 page not found", log, log[-3000:])
            if backend == "etcd-v2":
                self.assertIn("RendezvousConnectionError: The connection to etcd has failed", log, log[-3000:])

    def test_etcd_backend_leader_killed_mid_training(self):
        # The leader is a member torch does not talk to (torch's client takes one endpoint: member 1): an
        # election, nothing else, for torch's agents (their lease renewals and the exit barrier go to member 1).
        etcd = self.etcd()
        etcd.make_leader(1)
        agents = [self.torchrun(h, "etcd", 2, steps=2000) for h in (1, 2)]
        self.wait_steps()
        etcd.kill(1)
        new, seconds = etcd.wait_leader_other_than(1)
        print(f"\n  killed etcd leader m2; m{new + 1} leads after {seconds:.1f} s", flush=True)
        self.wait_steps(self.steps_logged() + 2)
        self.stop_training()
        self.assert_job(agents, 2 * NPROC)

    def test_etcd_backend_its_endpoint_member_killed_mid_training(self):
        # --rdzv_endpoint names member 1, but torch's etcd client (python-etcd, allow_reconnect=True) asks it for
        # the cluster's members when it is created ("Etcd machines: [...]" in its log) and fails over to
        # another one: member 1 (the leader) SIGKILLed mid-training, its requests to member 1 fail
        # (1.13 logs "Request to server http://10.99.0.1:2379 failed: MaxRetryError"), and the job ends with 0.
        etcd = self.etcd()
        etcd.make_leader(0)
        agents = [self.torchrun(h, "etcd", 2, steps=2000) for h in (1, 2)]
        self.wait_steps()
        etcd.kill(0)
        etcd.wait_leader_other_than(0)
        self.wait_steps(self.steps_logged() + 2)
        self.stop_training()
        self.assert_job(agents, 2 * NPROC)
        machines = ", ".join(f"'http://{etcd.endpoint(i)}'" for i in range(3))
        for agent in agents:
            self.assertIn(f"Etcd machines: [{machines}]", agent.log(), agent.describe())


class DdprunOnEtcd(EtcdHostsTestCase):
    """ddprun's --rdzv_backend etcd (torch's legacy protocol) and etcd-v2 (its dynamic rendezvous over etcd)."""

    @torch_subject
    def test_a_mixed_job_torchrun_and_ddprun_on_etcd(self):
        self.etcd()
        agents = [self.torchrun(1, "etcd", 3)]
        agents += [self.ddprun(h, "etcd", 3, endpoint=f"{address(1)}:2379") for h in (2, 3)]
        self.assert_job(agents, 3 * NPROC)

    def ddprun_alone(self, backend):
        self.etcd()
        agents = [self.ddprun(h, backend, 3) for h in (1, 2, 3)]
        self.assert_job(agents, 3 * NPROC)

    def test_b_ddprun_alone_on_etcd(self):
        self.ddprun_alone("etcd")

    @torch_subject
    def test_b_ddprun_alone_on_etcd_v2(self):
        self.ddprun_alone("etcd-v2")


if __name__ == "__main__":
    unittest.main(verbosity=2)
