"""ddprun under a real Slurm: slurmctld and one slurmd per network-namespace host (scripts/slurm-cluster.sh).

The jobs are the shipped examples, submitted with sbatch as a user would:
  - sbatch -N2 scripts/examples/sbatch-static.sh trains a real PyTorch DDP job (gloo) on 2 hosts x 2 workers;
  - scancel in the middle of that training leaves no process behind on any host;
  - `scancel --signal=USR1` (what `sbatch --signal=USR1@T` does before a time limit) reaches every worker,
    ddprun exits 75 and the example requeues the job;
  - a worker that crashes under srun is restarted by ddprun (scripts/examples/sbatch-elastic.sh, c10d);
  - the head node (which hosts the c10d store) lost mid-run on that example: the other node takes the store
    over and finishes the training alone, from the checkpoint;
  - what ddprun derives from srun's variables (--dry-run), and the batch-script mistake it refuses;
  - the workers' interpreter under srun (with the torch 2.6 root: scripts/torch26-root.sh `run` under slurmstepd)
    keeps the task's pid and directory, sees its node's name, eth0 for gloo, the nodes in /etc/hosts and the
    expected torch.
The static example's training, the crash restarted under the elastic example and the interpreter under srun run
real torch (ddp_train.py) with every torch version; the other jobs are the agents' and Slurm's doing and run the
examples with the light worker (light_train.py, TRAIN=), once (ddprun_testlib.torch_subject).
And, without a cluster: every expected value of tests/launcher/hostlist_test.cc's scontrol table is what
`scontrol show hostnames` prints here (needs scontrol only); a signal to one agent reaches the other node's
workers as the same signal, and its later arrival there is not taken as a second one (two local agents).

Needs root (namespaces, daemons) and Slurm: as root, the module installs slurm-wlm and munge first when they
are missing (`slurm-cluster.sh install`, before any test: installing it half-way made a fresh machine's first run
skip the scontrol test and run the rest, which ctest then reported as a skipped module). The tests skip only
what the machine cannot do - no root, no network namespaces, Slurm not installable - with the reason
(ddprun_testlib.skip_unless_required: a failure under DDPRUN_REQUIRE_ALL_SUITES=1). A cluster that should start
and does not is a failure with slurm-cluster.sh's output. The hosts' names are fixed, so the module holds
/tmp/ddprun-test-cluster.lock (shared with test_elastic_netns.py) while the cluster is up.
Environment (tests/integration/CMakeLists.txt sets it): DDPRUN, REPO; DDPRUN_IT_KEEP=1 keeps each test's
directory. Only 10.99.0.x and 127.0.0.1 are used. Standard library only; run with /usr/bin/python3 (torch).
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import ddprun_testlib
from etcd_cluster import EtcdCluster
from ddprun_testlib import EXPECTED_TORCH, PYTHON, free_port, skip_unless_required, torch_subject
from slurm_testlib import (DDPRUN, ELASTIC, EXIT_SLURM_INTERRUPTED, HOSTLIST_TEST, HOSTS, INSTALL_TIMEOUT,
                            JOB_TIMEOUT, SLURM_CLUSTER, SLURM_CONF, SLURM_DIR, STATIC, TEST_CLUSTER, TRAIN_ARGS,
                            UP_TIMEOUT, host_job_processes, processes_mentioning, run, slurm_env, wait_until)

# AUTH by hand with a MUNGE credential of whoever runs it (docs/wire-protocol.md): an attacker skips checking the
# store's proof. Prints the store's answer to phase 2 and the uid.
RAW_MUNGE_AUTH = """
import hashlib, os, socket, struct, subprocess, sys
host, port, job, munge_socket = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def part(b):
    return str(len(b)).encode() + b":" + b
def recv(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            return out
        out += chunk
    return out
s = socket.create_connection((host, port), timeout=10)
nonce = os.urandom(32)
s.sendall(bytes([0xDD]) + struct.pack("<IQ", 1, len(nonce)) + nonce)
store_nonce = recv(s, struct.unpack("<Q", recv(s, 8))[0])
recv(s, struct.unpack("<Q", recv(s, 8))[0])  # the store's proof: not checked
# docs/wire-protocol.md: the job by the SHA-256 (lowercase hex) of "Slurm job <id>, run <rdzv_id>".
job_sha256 = hashlib.sha256(job.encode()).hexdigest().encode()
payload = b"".join(part(p) for p in (b"ddprun store auth v1", b"agent", job_sha256, nonce, store_nonce))
cred = subprocess.run(["munge", "-S", munge_socket], input=payload, capture_output=True, check=True).stdout.strip()
s.sendall(bytes([0xDD]) + struct.pack("<IQ", 2, len(cred)) + cred)
print("admitted" if recv(s, 1) == b"\\x01" else "refused", os.getuid())
"""

# A worker that records the signals it gets and keeps running, as a worker that saves a checkpoint on SIGUSR1
# and waits to be stopped (docs/slurm.md): ddprun ends it after --shutdown_timeout.
SIGNAL_WORKER = """
import os, signal, socket, sys
out, rank = sys.argv[1], os.environ["RANK"]
def record(sig, frame):
    with open(os.path.join(out, "sig-" + rank), "a") as f:
        f.write(signal.Signals(sig).name + "\\n")
for s in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(s, record)
with open(os.path.join(out, "starting-" + rank), "w") as f:
    f.write(socket.gethostname())
os.replace(os.path.join(out, "starting-" + rank), os.path.join(out, "ready-" + rank))  # whole files only
while True:
    signal.pause()
"""


# Why this machine has no Slurm, when it has none after setUpModule (None: Slurm is installed).
slurm_missing = None


def setUpModule():
    """Installs Slurm when it is missing, before any test runs: every test then finds it, or skips saying why."""
    global slurm_missing
    if os.geteuid() != 0:
        if not shutil.which("scontrol"):
            slurm_missing = ("Slurm is not installed, and installing it needs root (DDPRUN_DEPS_SLURM=1 "
                             "scripts/install-deps.sh)")
        return
    done = subprocess.run(["bash", SLURM_CLUSTER, "install"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=INSTALL_TIMEOUT)
    if done.returncode == 77:
        slurm_missing = f"Slurm is not installed and cannot be installed here:\n{done.stdout[-2000:]}"
    elif done.returncode != 0:
        raise AssertionError(f"slurm-cluster.sh install exited {done.returncode}:\n{done.stdout[-3000:]}")


def scontrol_cases():
    """The rows of hostlist_test.cc's scontrol table: [(list, [hosts])]."""
    with open(HOSTLIST_TEST) as f:
        text = f.read()
    table = text[text.index("// BEGIN SCONTROL CASES"):text.index("// END SCONTROL CASES")]
    unescape = lambda s: s.replace("\\t", "\t").replace("\\n", "\n").replace('\\"', '"')
    cases = []
    for m in re.finditer(r'\{"((?:[^"\\]|\\.)*)",\s*\{([^{}]*)\}\},', table):
        cases.append((unescape(m[1]), [unescape(h) for h in re.findall(r'"((?:[^"\\]|\\.)*)"', m[2])]))
    return cases


class HostlistAgainstScontrol(unittest.TestCase):
    def test_scontrol_prints_the_expected_hosts(self):
        scontrol = shutil.which("scontrol")
        if not scontrol:
            skip_unless_required(slurm_missing or "scontrol is not on PATH although Slurm is installed")
        cases = scontrol_cases()
        self.assertGreaterEqual(len(cases), 30, "could not read the table of tests/launcher/hostlist_test.cc")
        with tempfile.TemporaryDirectory(prefix="ddprun-scontrol-") as tmp:
            conf = os.path.join(tmp, "slurm.conf")  # scontrol needs a configuration, not a cluster
            with open(conf, "w") as f:
                f.write("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
            for hostlist, expected in cases:
                done = subprocess.run([scontrol, "show", "hostnames", hostlist], env=dict(os.environ, SLURM_CONF=conf),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
                self.assertEqual(done.stdout.split("\n")[:-1], expected, f"scontrol show hostnames {hostlist!r}")


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


class PeerSignals(unittest.TestCase):
    """What Slurm's signal delivery relies on, without Slurm: two agents on 127.0.0.1, one worker each. A signal
    to one agent reaches the other node's worker as the same signal; the same signal arriving there a moment
    later (Slurm signals every node) is not a second one."""

    def test_a_peer_signal_is_forwarded_as_itself_and_not_escalated(self):
        if not os.access(DDPRUN, os.X_OK):
            raise RuntimeError(f"DDPRUN={DDPRUN} is not an executable; build ddprun or set DDPRUN")
        with tempfile.TemporaryDirectory(prefix="ddprun-peer-signal-") as tmp:
            worker = os.path.join(tmp, "signal_worker.py")
            with open(worker, "w") as f:
                f.write(SIGNAL_WORKER)
            port = str(free_port())
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
            agents, logs = [], []
            try:
                for node in (0, 1):
                    logs.append(open(os.path.join(tmp, f"agent{node}.log"), "w+"))
                    agents.append(subprocess.Popen(
                        [DDPRUN, "--nnodes", "2", "--node_rank", str(node), "--master_addr", "127.0.0.1",
                         "--master_port", port, "--nproc_per_node", "1", "--shutdown_timeout", "2", "--python",
                         PYTHON, worker, tmp], env=env, stdin=subprocess.DEVNULL, stdout=logs[-1],
                        stderr=subprocess.STDOUT, start_new_session=True))
                describe = lambda: "".join(f"--- agent {n}\n{read(l.name)}" for n, l in enumerate(logs))
                wait_until(lambda: len(glob.glob(os.path.join(tmp, "ready-*"))) == 2, 60, "both workers", describe)
                agents[0].send_signal(signal.SIGUSR1)
                sig1 = os.path.join(tmp, "sig-1")
                wait_until(lambda: os.path.exists(sig1), 30, "node 1's worker to get a signal", describe)
                agents[1].send_signal(signal.SIGUSR1)  # as Slurm would, a moment later
                codes = [a.wait(timeout=60) for a in agents]
                self.assertEqual(codes, [128 + signal.SIGUSR1] * 2, describe())
                with open(sig1) as f:
                    self.assertEqual(set(f.read().split()), {"SIGUSR1"}, describe())
                log1 = read(logs[1].name)
                self.assertIn("stopping 1 worker(s) with SIGUSR1", log1, describe())
                self.assertIn("received SIGUSR1 (already forwarded: node 0 got it first)", log1, describe())
                self.assertNotIn("killing the workers now", log1, describe())
            finally:
                for a in agents:
                    if a.poll() is None:
                        os.killpg(a.pid, signal.SIGKILL)
                    a.wait(timeout=30)
                for log in logs:
                    log.close()


class OnSlurm(ddprun_testlib.SharedHostsTestCase):
    NEEDS_ROOT_TO = "start Slurm on network namespaces"

    @classmethod
    def unavailable(cls):
        return slurm_missing

    @classmethod
    def bring_up(cls):
        """slurm-cluster.sh up: exit 77 (no namespaces here) skips; any other failure is the test's failure."""
        try:
            up = subprocess.run(["bash", SLURM_CLUSTER, "up", str(HOSTS)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=UP_TIMEOUT)
            rc, output, how = up.returncode, up.stdout, f"exited {up.returncode}"
        except subprocess.TimeoutExpired as e:
            partial = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output or ""
            rc, output, how = None, partial, f"was killed after {UP_TIMEOUT} s"
        if rc == 0:
            return
        cls.take_down()
        if rc == 77:
            skip_unless_required(f"this machine cannot run a Slurm cluster (slurm-cluster.sh up {HOSTS} exited 77):\n"
                                 f"{output[-2000:]}")
        raise AssertionError(f"the Slurm cluster did not start: slurm-cluster.sh up {HOSTS} {how} (this machine has "
                             f"what it needs: root, namespaces, Slurm):\n{output[-5000:]}")

    @classmethod
    def take_down(cls):
        subprocess.run(["bash", SLURM_CLUSTER, "down"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun-slurm-it-")
        self.jobs = []
        self.addCleanup(self._cleanup)
        # The examples' training worker: ddp_train.py where the test is marked torch_subject, else the light
        # worker (docs/testing.md, "Which worker").
        self.worker = ddprun_testlib.worker_for(self)

    def slurm_env(self, **extra):
        return slurm_env(self.worker, **extra)

    def _cleanup(self):
        for job in self.jobs:
            subprocess.run(["scancel", job], env=slurm_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for job in self.jobs:
            try:
                self.wait_job_gone(job, 60)
            except AssertionError as e:
                print(f"\n{e}", flush=True)
        if os.environ.get("DDPRUN_IT_KEEP"):
            print(f"\nkept {self.tmp}", flush=True)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def output(self, name="out.txt"):
        try:
            with open(self.path(name), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def describe(self):
        return f"--- job output (tail) ---\n{self.output()[-5000:]}"

    def sbatch(self, script, args=(), wait=False, env=None, sbatch_args=()):
        """Submits `script`; returns (job id, the job's exit code once it ended if `wait`, else None). The wait
        polls the job's state every 0.2 s: `sbatch -W` polls at 2, 4, 6 ... 10 s intervals, which added up to
        30 s to each job here."""
        cmd = ["sbatch", "--parsable", "-N", str(HOSTS), "-o", self.path("out.txt"), "--open-mode=append",
               "-D", self.tmp, *sbatch_args, script, *args]
        done = run(cmd, env=env or self.slurm_env(), timeout=30)
        job = done.stdout.strip().split(";")[0]  # --parsable: the job id first
        if not job.isdigit():
            raise AssertionError(f"{' '.join(cmd)} printed {done.stdout!r}")
        self.jobs.append(job)
        if not wait:
            return job, None
        self.wait_job_gone(job, JOB_TIMEOUT)
        code = self.job_field(job, "ExitCode")  # "<exit status>:<signal>" of the batch script
        if not code or ":" not in code:
            raise AssertionError(f"job {job} ended without an ExitCode ({code!r})\n{self.describe()}")
        status, sig = (int(x) for x in code.split(":"))
        return job, status if not sig else 128 + sig

    def job_field(self, job, field):
        done = run(["scontrol", "-o", "show", "job", job], check=False)
        m = re.search(rf"\b{field}=(\S+)", done.stdout)
        return m[1] if m else None

    def wait_job_gone(self, job, timeout):
        ended = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", None)
        wait_until(lambda: self.job_field(job, "JobState") in ended, timeout, f"job {job} to end",
                   lambda: f"JobState={self.job_field(job, 'JobState')}\n{self.describe()}")

    def assert_nothing_left(self, marker):
        """No job process on any host and none anywhere that mentions `marker` (within KillWait and a margin)."""
        def clean():
            return all(not host_job_processes(h) for h in range(1, HOSTS + 1)) and not processes_mentioning(marker)

        wait_until(clean, 30, "every process of the job to be gone",
                   lambda: "\n".join([f"host {h}: {host_job_processes(h)}" for h in range(1, HOSTS + 1)] +
                                     [f"mentioning {marker}: {processes_mentioning(marker)}"]))

    def results(self):
        out = []
        for f in sorted(glob.glob(self.path("res", "rank*.json"))):
            with open(f) as fh:
                out.append(json.load(fh))
        return out

    def wait_training(self):
        wait_until(lambda: re.search(r"step \d+/\d+ loss", self.output()), JOB_TIMEOUT, "training steps",
                   self.describe)

    # ---- the scenarios ----

    @torch_subject
    def test_static_example_trains_ddp_on_two_hosts(self):
        job, rc = self.sbatch(STATIC, ["--steps", "40", *TRAIN_ARGS, "--out", self.path("res")], wait=True)
        out = self.output()
        self.assertEqual(rc, 0, self.describe())
        results = self.results()
        self.assertEqual(sorted(r["rank"] for r in results), [0, 1, 2, 3], self.describe())
        self.assertTrue(all(r["world_size"] == 4 and r["identical"] for r in results), results)
        self.assertEqual(sorted(r["group_rank"] for r in results), [0, 0, 1, 1], results)
        self.assertEqual(len({r["checksum"] for r in results}), 1, results)
        # Node 0 (n1) hosted the store on the first port derived from the job id; node 1 found it there.
        port = 20000 + int(job) % 10000
        self.assertRegex(out, rf"ddprun n0 info: Slurm step {job}\.0: the store listens on n1:{port}", out)
        self.assertRegex(out, rf"ddprun n1 info: Slurm step {job}\.0: found the store on n1:{port}", out)
        self.assertIn("parameters identical: True", out)
        self.assert_nothing_left(self.tmp)

    def on_host(self, host, argv):
        done = subprocess.run(["bash", TEST_CLUSTER, "exec", str(host), *argv], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout + done.stderr

    def test_munge_admits_the_jobs_user_only(self):
        # The static example with no flag for it: under Slurm the agents authenticate with MUNGE.
        # The job trains until the checks below are done (--stop-file), not for a fixed 600 steps.
        job, _ = self.sbatch(STATIC, ["--steps", "100000", *TRAIN_ARGS, "--stop-file", self.path("stop"),
                                      "--out", self.path("res")])
        self.wait_training()
        port, name = 20000 + int(job) % 10000, f"Slurm job {job}, run {job}"
        munge_socket = os.path.join(SLURM_DIR, "munge", "munge.socket")
        script = self.path("raw_munge_auth.py")
        with open(script, "w") as f:
            f.write(RAW_MUNGE_AUTH)
        os.chmod(self.tmp, 0o755)
        raw = [sys.executable, script, "10.99.0.1", str(port), name, munge_socket]  # the host's: it runs `munge`
        # By hand from host 2: the job's user (root) is admitted, so the payload is the one the store expects;
        # the same credential made by another user (nobody) is refused.
        self.assertEqual(self.on_host(2, raw), (0, "admitted 0\n"))
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        self.assertEqual(self.on_host(2, nobody + raw), (0, "refused 65534\n"))
        # A ddprun agent of another user with the job's id and MUNGE: the store's credential is not its user's.
        # (A copy nobody may run: the build's directory may be private, as a fresh clone under mktemp -d is.)
        ddprun = self.path("ddprun")
        shutil.copy(DDPRUN, ddprun)
        rc, log = self.on_host(2, nobody + ["env", f"SLURM_JOB_ID={job}", f"SLURM_CONF={SLURM_CONF}", ddprun,
                                            "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.99.0.1",
                                            "--master_port", str(port), "--rdzv_id", job, "--rdzv_auth", "munge",
                                            "--log_dir", "/tmp", "--no_python", "/bin/true"])
        self.assertEqual(rc, 4, log)
        self.assertIn("a MUNGE credential of uid 0, not of the job's user (uid 65534)", log)
        with open(self.path("stop"), "w"):
            pass
        self.wait_job_gone(job, JOB_TIMEOUT)
        self.assertEqual(self.job_field(job, "ExitCode"), "0:0", self.describe())
        out = self.output()
        self.assertEqual(out.count(f"the job's store admits only agents with a MUNGE credential of {name} (uid 0)"),
                         2, out)
        self.assertIn("refused AUTH: a MUNGE credential of uid 65534, not of the job's user (uid 0)", out)
        self.assertNotIn("restarting", out)
        results = self.results()
        self.assertEqual(sorted(r["rank"] for r in results), [0, 1, 2, 3], self.describe())
        self.assertEqual(len({r["checksum"] for r in results}), 1, results)
        self.assert_nothing_left(self.tmp)

    def test_scancel_mid_run_leaves_no_process(self):
        job, _ = self.sbatch(STATIC, ["--steps", "1000000", *TRAIN_ARGS, "--out", self.path("res")])
        self.wait_training()
        run(["scancel", job])
        self.wait_job_gone(job, 60)
        self.assert_nothing_left(self.tmp)
        out = self.output()
        self.assertRegex(out, r"ddprun n\d warning: received SIGTERM: forwarding it to the workers", out)
        self.assertEqual(self.results(), [], "no rank may finish")

    def test_usr1_reaches_workers_and_ddprun_exits_75_for_requeue(self):
        worker = self.path("signal_worker.py")
        with open(worker, "w") as f:
            f.write(SIGNAL_WORKER)
        job, _ = self.sbatch(STATIC, [self.tmp], env=self.slurm_env(TRAIN=worker, DDPRUN_ARGS="--shutdown_timeout 3"))
        wait_until(lambda: len(glob.glob(self.path("ready-*"))) == 4, JOB_TIMEOUT, "4 workers to start",
                   self.describe)
        hosts = set()
        for f in glob.glob(self.path("ready-*")):
            with open(f) as fh:
                hosts.add(fh.read())
        self.assertEqual(hosts, {"n1", "n2"})
        run(["scancel", "--signal=USR1", job])  # the job steps' tasks only, as sbatch --signal=USR1@T does
        wait_until(lambda: "requeueing job" in self.output(), 60, "the example to requeue the job", self.describe)
        out = self.output()
        self.assertIn(f"ddprun was interrupted by Slurm (exit {EXIT_SLURM_INTERRUPTED}): requeueing job {job}", out)
        self.assertRegex(out, rf"exit(ed with exit)? code {EXIT_SLURM_INTERRUPTED}", out)
        for rank in range(4):
            with open(self.path(f"sig-{rank}")) as f:
                self.assertEqual(set(f.read().split()), {"SIGUSR1"}, f"rank {rank}\n{out}")
        wait_until(lambda: (self.job_field(job, "Restarts") or "0") != "0", 30, "the requeue", self.describe)
        run(["scancel", job])
        self.wait_job_gone(job, 60)
        self.assert_nothing_left(self.tmp)

    @torch_subject
    def test_worker_crash_is_restarted_by_ddprun_elastic_example(self):
        # last_call_timeout 10 s: both nodes rejoin after the crash and the round closes as soon as the second
        # arrives (MAX reached); 3 s was once too short for a node's agent on a loaded machine, which then came
        # as a newcomer and made a third attempt.
        env = self.slurm_env(MAX_RESTARTS="1", CHECKPOINT=self.path("checkpoint.pt"),
                             DDPRUN_ARGS="--rdzv_conf=last_call_timeout=10,join_timeout=120")
        job, rc = self.sbatch(ELASTIC, ["--steps", "40", *TRAIN_ARGS, "--save-every", "10", "--fail-rank", "3",
                                        "--fail-step", "15", "--out", self.path("res")], wait=True, env=env)
        out = self.output()
        self.assertEqual(rc, 0, self.describe())
        self.assertIn("rank 3: failing on purpose at step 15 (attempt 0)", out)
        self.assertRegex(out, r"restarting the worker group \(1 of 1 restarts\)", out)
        self.assertRegex(out, r"resumed from .*checkpoint\.pt at step \d+", out)
        results = self.results()
        self.assertEqual(sorted(r["rank"] for r in results), [0, 1, 2, 3], self.describe())
        self.assertTrue(all(r["attempt"] == 1 and r["identical"] and r["world_size"] == 4 for r in results), results)
        self.assertIn(f"Slurm step {job}.0: the store listens on n1:{20000 + int(job) % 10000}", out)
        self.assert_nothing_left(self.tmp)

    def test_worker_crash_is_restarted_on_etcd(self):
        """The elastic example with the rendezvous in etcd (one member on host 1): Slurm's settings, the crash and
        the restart as with c10d, no store in any agent."""
        etcd = EtcdCluster(self.path("etcd"), hosts=(1,))
        self.addCleanup(etcd.stop)
        etcd.start()
        # Without an agent store the workers' rank 0 creates the job's TCPStore, with use_libuv taken from
        # USE_LIBUV (default 1): Debian 13's torch 2.6 has no libuv (test_etcd_netns.py, LAUNCHER_ENV).
        libuv = {} if (EXPECTED_TORCH or "1.").startswith("1.") else {"USE_LIBUV": "0"}
        env = self.slurm_env(MAX_RESTARTS="1", CHECKPOINT=self.path("checkpoint.pt"), RDZV_BACKEND="etcd",
                             RDZV_ENDPOINT=etcd.endpoints(),
                             DDPRUN_ARGS="--rdzv_conf=last_call_timeout=10,timeout=120", **libuv)
        job, rc = self.sbatch(ELASTIC, ["--steps", "40", *TRAIN_ARGS, "--save-every", "10", "--fail-rank", "3",
                                        "--fail-step", "15", "--out", self.path("res")], wait=True, env=env)
        out = self.output()
        self.assertEqual(rc, 0, self.describe())
        self.assertIn("rank 3: failing on purpose at step 15 (attempt 0)", out)
        self.assertRegex(out, r"restarting the worker group \(1 of 1 restarts\)", out)
        self.assertIn(f"keys under /torchelastic/p2p/run_{job}", out)  # the run id is Slurm's job id
        results = self.results()
        self.assertEqual(sorted(r["rank"] for r in results), [0, 1, 2, 3], self.describe())
        self.assertTrue(all(r["attempt"] == 1 and r["identical"] and r["world_size"] == 4 for r in results), results)
        self.assertNotIn("the store listens on", out)
        etcd.stop()  # the test's own member, on host 1 and under the test's directory: not the job's
        self.assert_nothing_left(self.tmp)

    def test_head_node_lost_the_elastic_example_goes_on(self):
        conf = "last_call_timeout=3,join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3"
        env = self.slurm_env(MIN_NODES="1", CHECKPOINT=self.path("checkpoint.pt"), DDPRUN_ARGS=f"--rdzv_conf={conf}")
        job, _ = self.sbatch(ELASTIC, ["--steps", "100000", *TRAIN_ARGS, "--save-every", "10",
                                       "--stop-file", self.path("stop"), "--out", self.path("res")], env=env)
        self.wait_training()
        wait_until(lambda: os.path.exists(self.path("checkpoint.pt")), 60, "the first checkpoint", self.describe)
        # n1's agent (it hosts the store) dies, and its workers with it; the batch script's srun, slurmstepd and
        # slurmd stay, as when a node's training processes are OOM-killed.
        victims = [int(p.split()[0]) for p in host_job_processes(1) if p.split()[1:2] == [DDPRUN]]
        self.assertTrue(victims, f"no ddprun on n1: {host_job_processes(1)}\n{self.describe()}")
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # The job goes on on n2 alone, from the checkpoint: then it may stop (--stop-file), not after 2000 steps.
        wait_until(lambda: re.search(r"resumed from .*checkpoint\.pt at step [1-9]\d*[\s\S]*step \d+/\d+ loss",
                                     self.output()), JOB_TIMEOUT, "training resumed on n2", self.describe)
        with open(self.path("stop"), "w"):
            pass
        self.wait_job_gone(job, JOB_TIMEOUT)
        out = self.output()
        self.assertRegex(out, r"ddprun n2:\d+ warning: rendezvous \S+: the store at n1:\d+ is lost", out)
        self.assertRegex(out, r"this node \(10\.99\.0\.2:\d+\) hosts the job's store from now on", out)
        self.assertRegex(out, r"ddprun n2:\d+ info: round \d+: node 0/1, ranks 0\.\.1 of 2", out)
        self.assertRegex(out, r"resumed from .*checkpoint\.pt at step [1-9]\d*", out)
        self.assertNotIn("restarting the worker group", out)
        results = self.results()
        self.assertEqual(sorted(r["rank"] for r in results), [0, 1], self.describe())
        self.assertTrue(all(r["world_size"] == 2 and r["identical"] for r in results), results)
        self.assert_nothing_left(self.tmp)

    @torch_subject
    def test_workers_interpreter_under_srun_sees_its_node(self):
        # The interpreter the examples' workers run (with torch 2.6: torch26-root.sh `run` under slurmstepd): it is
        # the task slurmstepd started (same pid), in the job's directory, on its node's network and name, and the
        # nodes' names resolve (the root bind-mounts /etc/hosts, where slurm-cluster.sh writes them).
        probe = ddprun_testlib.write_worker_probe(self.tmp)
        names = [f"n{h}" for h in range(1, HOSTS + 1)]
        job, rc = self.sbatch("--wrap", [f"srun --ntasks-per-node=1 {PYTHON} {probe} {self.tmp} {' '.join(names)}"],
                              wait=True)
        self.assertEqual(rc, 0, self.describe())
        for h, name in enumerate(names, start=1):
            info = ddprun_testlib.read_json_file(self.path(f"probe-{name}.json"))
            self.assertIsNotNone(info, f"no probe result from {name}\n{self.describe()}")
            ddprun_testlib.check_worker_probe(self, info, name, f"10.99.0.{h}")
            self.assertEqual(info["resolved"], {n: f"10.99.0.{i}" for i, n in enumerate(names, start=1)}, info)
            self.assertEqual(info["env"]["SLURMD_NODENAME"], name, info)
            self.assertEqual(str(info["pid"]), info["env"]["SLURM_TASK_PID"], info)
            self.assertEqual(info["cwd"], self.tmp, info)
        self.assert_nothing_left(self.tmp)

    def test_dry_run_shows_what_srun_gave_and_batch_misuse_is_refused(self):
        cmd = f"srun --ntasks-per-node=1 {DDPRUN} --nproc_per_node 2 --dry-run train.py"
        job, rc = self.sbatch("--wrap", [cmd], wait=True, sbatch_args=["-o", self.path("dry.txt")])
        dry = self.output("dry.txt")
        self.assertEqual(rc, 0, dry)
        for rank in (0, 1):
            self.assertIn(f"    --node_rank {rank}  <- SLURM_NODEID={rank}\n", dry)
        self.assertEqual(dry.count("    --nnodes 2  <- SLURM_STEP_NUM_NODES=2\n"), 2, dry)
        self.assertEqual(dry.count("    --master_addr n1  <- SLURM_STEP_NODELIST=n[1-2] (first host)\n"), 2, dry)
        self.assertEqual(dry.count(f"    --rdzv_id {job}  <- SLURM_JOB_ID={job}\n"), 2, dry)
        # ddprun in the batch script of a 2-node job, without srun: the second node would never join.
        job, rc = self.sbatch("--wrap", [f"{DDPRUN} --nproc_per_node 2 train.py"], wait=True,
                              sbatch_args=["-o", self.path("batch.txt")])
        self.assertEqual(rc, 2, self.output("batch.txt"))
        self.assertIn("ddprun runs in the batch script of a 2-node job", self.output("batch.txt"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
