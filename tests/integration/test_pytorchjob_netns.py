"""A Kubeflow PyTorchJob, emulated: network-namespace "pods" resolvable by their pod names (scripts/test-cluster.sh
`names`), the environment the training operator injects, the launcher started as the container command; ddprun
and torchrun run the same job in the same pods, and what a log collector and the operator see is compared.

Pods: pj-master-0 and pj-worker-0 (a static job: MASTER_ADDR/PORT, WORLD_SIZE, RANK, PET_MASTER_ADDR/PORT,
PET_NNODES=2, PET_NODE_RANK, PET_NPROC_PER_NODE=1) on hosts 1 and 2; pje-worker-0 and pje-worker-1 (an elastic
job: PET_RDZV_BACKEND=c10d, PET_RDZV_ENDPOINT=pje-worker-0:PORT, PET_RDZV_ID, PET_NNODES=2:2, PET_MAX_RESTARTS,
PET_RDZV_CONF) on hosts 3 and 4. Every pod also gets PYTHONUNBUFFERED=1 and PET_LOG_DIR. The container command
is `ddprun compat_worker.py` (DDPRUN_PYTHON names the workers' interpreter) or torchrun of the workers' torch
(scripts/torch26-root.sh run /usr/bin/torchrun for 2.6; /usr/bin/torchrun for 1.13, which needs PET_REDIRECTS
and PET_TEE 1 on Python 3.11: both launchers then get them). torchrun gets PET_MONITOR_INTERVAL=0.1.

Compared per pod: stdout byte for byte, the workers' stderr lines (the launchers' own log lines left out), the
failure summary (times, hosts, pids masked), the files under PET_LOG_DIR (the run directory's random name
masked; error.json by its message), and the exit codes, for: success (static and elastic); a Python exception
in the worker pod (exit 1 both); the worker pod's worker SIGKILLed, as by the OOM killer (torchrun 1, ddprun
137); and the pods' SIGTERM (the job deleted, preempted) with a 30 s grace period, the workers saving a
checkpoint on SIGTERM (torchrun 1, ddprun 143; each launcher must end on its own within the grace). Where one
node's failure ends the job, ddprun ends the other pod too (the same code); torchrun leaves it to the
operator, so the other pod is not compared and gets the operator's SIGTERM.
"""
import json
import os
import re
import signal
import subprocess
import time
import unittest

import ddprun_testlib
from ddprun_testlib import PYTHON, REPO, free_port, read_pidfile, torch_subject, wait_until
import netns_hosts
from netns_hosts import cluster
from test_pytorch_errors import TORCH_113, masked, summary_block
from test_torchrun_compat import worker_lines

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat_worker.py")
DDPRUN = ddprun_testlib.DDPRUN
PODS = ["pj-master-0", "pj-worker-0", "pje-worker-0", "pje-worker-1"]  # hosts 1..4
assert netns_hosts.HOSTS == len(PODS)
STATIC, ELASTIC = (1, 2), (3, 4)
JOB_WAIT = 150  # seconds for one job (two torch workers and, for torchrun, two launchers importing torch)
GRACE = 30  # terminationGracePeriodSeconds
TEE_PREFIX = "[default0]:" if TORCH_113 else ""  # PET_TEE=1 under 1.13 (see start_job)


class Pod:
    """One launcher running as the container command of a pod (a test host); stdout and stderr kept apart."""

    def __init__(self, host, command, env, directory):
        self.host, self.name = host, PODS[host - 1]
        self.started, self.ended = time.monotonic(), None
        self.job = [self]  # every pod of its job (start_job sets it): what a timeout describes
        self.out_path = os.path.join(directory, f"{self.name}.out")
        self.err_path = os.path.join(directory, f"{self.name}.err")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            # test-cluster.sh execs all the way down: this pid is the launcher's, as a container's PID 1 is.
            self.proc = subprocess.Popen(["bash", netns_hosts.CLUSTER, "exec", str(host), *command],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                         start_new_session=True)

    def stdout(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def describe(self):
        code = self.proc.poll()
        state = "running" if code is None else f"exit {code}"
        if self.ended is not None:
            state += f" after {self.ended - self.started:.1f} s"
        return (f"--- pod {self.name} ({state}): stdout ---\n{self.stdout()[-2000:]}\n--- stderr ---\n"
                f"{self.stderr()[-4000:]}")

    def wait(self, timeout):
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pods = "\n".join(pod.describe() for pod in self.job)
            raise AssertionError(f"{self.name} still running after {timeout} s\n{pods}") from None
        self.ended = self.ended or time.monotonic()
        return code

    def terminate(self, grace, signalled=False):
        """The kubelet's way: SIGTERM (once: not again when `signalled`), then SIGKILL after `grace` s. Returns
        (exit code, ended on its own)."""
        if not signalled and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait(grace), True
        except AssertionError:
            self.proc.kill()
            return self.wait(30), False


def run_tree(log_dir):
    """The files under the only run directory in log_dir (directories end in "/"), and their contents
    (error.json: its message only)."""
    runs = os.listdir(log_dir)
    assert len(runs) == 1, runs
    run_dir = os.path.join(log_dir, runs[0])
    found = {}
    for root, dirs, files in os.walk(run_dir):
        rel = os.path.relpath(root, run_dir)
        prefix = "" if rel == "." else rel + "/"
        for d in dirs:
            found[prefix + d + "/"] = None
        for name in files:
            with open(os.path.join(root, name), errors="replace") as f:
                text = f.read()
            found[prefix + name] = json.loads(text)["message"]["message"] if name == "error.json" else text
    return runs[0], found


@torch_subject
class PyTorchJob(netns_hosts.HostsTestCase):
    """netns_hosts' four hosts (fresh for the module, no process left after a test), named as the pods."""

    @classmethod
    def bring_up(cls):
        super().bring_up()
        cluster("names", *PODS)

    def start_job(self, launcher, hosts, modes, port, elastic=False):
        """The job's pods on `hosts` (the first one is the master / rendezvous host), each running `launcher`;
        returns (pods, the directory of their files)."""
        directory = os.path.join(self.tmp, f"{launcher}-{'elastic' if elastic else 'static'}-{'-'.join(modes)}")
        os.makedirs(os.path.join(directory, "out"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
        env.update({"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "1", "COMPAT_MODE": ",".join(modes),
                    "COMPAT_OUT": os.path.join(directory, "out"), "DDPRUN_PYTHON": PYTHON})
        if TORCH_113:
            env.update({"PET_REDIRECTS": "1", "PET_TEE": "1"})
        if launcher == "torch":
            env["PET_MONITOR_INTERVAL"] = "0.1"
            command = (["/usr/bin/torchrun"] if TORCH_113 else
                       [os.path.join(REPO, "scripts", "torch26-root.sh"), "run", "/usr/bin/torchrun"])
        else:
            command = [DDPRUN]
        pods = []
        for index, host in enumerate(hosts):
            pod_env = dict(env, PET_LOG_DIR=os.path.join(directory, f"logs-{PODS[host - 1]}"))
            if elastic:
                pod_env.update({"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": f"{PODS[hosts[0] - 1]}:{port}",
                                "PET_RDZV_ID": "pje", "PET_NNODES": "2:2", "PET_MAX_RESTARTS": "1",
                                "PET_RDZV_CONF": "join_timeout=90"})
            else:
                master = PODS[hosts[0] - 1]
                pod_env.update({"MASTER_ADDR": master, "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                                "RANK": str(index), "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(port),
                                "PET_NNODES": "2", "PET_NODE_RANK": str(index)})
            pods.append(Pod(host, command + [WORKER], pod_env, directory))
        for pod in pods:
            pod.job = pods
        self.agents += pods  # HostsTestCase's clean-up kills what is left
        return pods, directory

    def describe(self, pods):
        return "\n".join(p.describe() for p in pods)

    def assert_same_pod(self, ours, theirs, summary=False):
        """ddprun's pod and torchrun's pod of the same name show the same console and files."""
        both = f"ddprun:\n{ours.describe()}\ntorchrun:\n{theirs.describe()}"
        self.assertEqual(ours.stdout(), theirs.stdout(), both)
        self.assertEqual(worker_lines(ours.stderr()), worker_lines(theirs.stderr()), both)
        if summary:
            self.assertEqual(masked(summary_block(ours.stderr())), masked(summary_block(theirs.stderr())), both)
        (our_run, our_files), (their_run, their_files) = (run_tree(self.log_dir_of(ours)),
                                                          run_tree(self.log_dir_of(theirs)))
        self.assertEqual(our_files, their_files, both)
        self.assertEqual(re.sub(r"_[a-z0-9_]{8}$", "", our_run), re.sub(r"_[a-z0-9_]{8}$", "", their_run))

    def log_dir_of(self, pod):
        return os.path.join(os.path.dirname(pod.out_path), f"logs-{pod.name}")

    def both_launchers(self, hosts, modes, act, elastic=False):
        """Runs the job under ddprun, then under torchrun; `act(launcher, pods, out)` does what the scenario
        does to the running pods and returns their exit codes. Returns {launcher: (pods, exit codes)}."""
        runs = {}
        for launcher in ("ddprun", "torch"):
            pods, directory = self.start_job(launcher, hosts, modes, free_port(), elastic)
            runs[launcher] = (pods, act(launcher, pods, os.path.join(directory, "out")))
        return runs

    def finished(self, launcher, pods, out):
        return [pod.wait(JOB_WAIT) for pod in pods]

    def test_success_static_and_elastic(self):
        for hosts, elastic in ((STATIC, False), (ELASTIC, True)):
            runs = self.both_launchers(hosts, ["gloo"], self.finished, elastic)
            for launcher, (pods, codes) in runs.items():
                self.assertEqual(codes, [0, 0], f"{launcher}\n{self.describe(pods)}")
                for pod in pods:
                    self.assertEqual(pod.stdout().splitlines()[-1], TEE_PREFIX + '{"world_size": 2, "sum": 1}',
                                     pod.describe())
            for ours, theirs in zip(runs["ddprun"][0], runs["torch"][0]):
                self.assert_same_pod(ours, theirs)

    def job_failed(self, launcher, pods):
        """The worker pod's worker failed: [the master pod's code, the worker pod's]. ddprun ends both pods.
        torchrun leaves the master pod to the operator (which deletes the pods of a failed job: SIGTERM), and
        torch 1.13's worker pod waits in its exit barrier for the master pod (300 s) before it exits: the
        master pod is deleted once the worker pod's torchrun logged its worker's failure."""
        if launcher == "ddprun":
            return [pods[0].wait(JOB_WAIT), pods[1].wait(JOB_WAIT)]
        wait_until(lambda: "failed (exitcode: " in pods[1].stderr() or pods[1].proc.poll() is not None, JOB_WAIT,
                   "torchrun in the worker pod to see its worker fail", lambda: self.describe(pods))
        master_code = pods[0].terminate(GRACE)[0]
        return [master_code, pods[1].wait(JOB_WAIT)]

    def test_a_python_exception_in_the_worker_pod(self):
        runs = self.both_launchers(STATIC, ["raise:1"], lambda launcher, pods, out: self.job_failed(launcher, pods))
        self.assertEqual(runs["ddprun"][1], [1, 1], self.describe(runs["ddprun"][0]))  # the job's code everywhere
        self.assertEqual(runs["torch"][1][1], 1, self.describe(runs["torch"][0]))
        self.assert_same_pod(runs["ddprun"][0][1], runs["torch"][0][1], summary=True)

    def test_a_worker_killed_as_by_the_oom_killer(self):
        def oom(launcher, pods, out):
            pids = self.worker_pids(out, pods)
            os.kill(pids[1], signal.SIGKILL)  # the worker pod's worker (rank 1)
            return self.job_failed(launcher, pods)

        runs = self.both_launchers(STATIC, ["wait"], oom)
        self.assertEqual(runs["ddprun"][1], [137, 137], self.describe(runs["ddprun"][0]))
        self.assertEqual(runs["torch"][1][1], 1, self.describe(runs["torch"][0]))
        self.assert_same_pod(runs["ddprun"][0][1], runs["torch"][0][1], summary=True)
        self.assertIn("  traceback : Signal 9 (SIGKILL) received by PID <pid>",
                      masked(summary_block(runs["ddprun"][0][1].stderr())))

    def test_the_pods_sigterm_with_its_grace_period(self):
        def delete_job(launcher, pods, out):
            self.worker_pids(out, pods)
            for pod in pods:
                pod.proc.send_signal(signal.SIGTERM)
            results = [pod.terminate(GRACE, signalled=True) for pod in pods]
            self.assertTrue(all(on_its_own for _, on_its_own in results),
                            f"{launcher} outlived the {GRACE} s grace period\n{self.describe(pods)}")
            return [code for code, _ in results]

        runs = self.both_launchers(STATIC, ["wait", "save_on_term"], delete_job)
        self.assertEqual(runs["ddprun"][1], [143, 143], self.describe(runs["ddprun"][0]))
        self.assertEqual(runs["torch"][1], [1, 1], self.describe(runs["torch"][0]))
        for ours, theirs in zip(runs["ddprun"][0], runs["torch"][0]):
            self.assertEqual(ours.stdout(), theirs.stdout(), f"{ours.describe()}\n{theirs.describe()}")
            self.assertTrue(ours.stdout().endswith(f"rank {ours.host - 1}: checkpoint saved\n"), ours.describe())

    def worker_pids(self, out, pods):
        """Waits for the pid files of ranks 0 and 1 (compat_worker.py "wait"); returns the pids."""
        files = [os.path.join(out, f"pid-{rank}") for rank in (0, 1)]
        wait_until(lambda: all(read_pidfile(f) for f in files), 90, "both workers' pid files",
                   lambda: self.describe(pods))
        return [read_pidfile(f) for f in files]


if __name__ == "__main__":
    unittest.main()
