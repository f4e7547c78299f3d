"""The OCI image in podman: the archive loads, its labels carry the release's version and commit, and two
containers on a podman network form a 2-node job that trains to the end (scripts/examples/ddp_train.py, real
torch 2.6 DDP over gloo between the containers) while `ddprun status`, run in a third container, sees both nodes
running: once static, started as Kubeflow Trainer v2 starts it (the literal command `torchrun`, which is ddprun in
this image, with PET_* variables and the master's DNS name), once elastic (c10d, --nnodes 2:2).

Podman runs as root with runc (crun refuses this machine's hybrid cgroups) and default_ulimits at the machine's
own limits: scripts/release.sh writes that containers.conf and the storage configuration under its cache and this
test uses them. The network, the containers and the loaded image's tag are this test's own and removed after it."""
import json
import os
import shutil
import subprocess
import time
import unittest

from release_testlib import CACHE, DDP_TRAIN, JOB_TIMEOUT, ReleaseTestCase, version

PODMAN_CONF = os.path.join(CACHE, "podman")


def podman(*args, timeout=300, check=True):
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", os.path.join(PODMAN_CONF, "containers.conf"))
    env.setdefault("CONTAINERS_STORAGE_CONF", os.path.join(PODMAN_CONF, "storage.conf"))
    out = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {out.returncode}: {out.stderr[-3000:]}")
    return out


class Image(ReleaseTestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("podman") is None:
            raise AssertionError("podman is not installed: scripts/release.sh installs it (Debian's podman, runc)")
        archive = os.path.join(os.environ.get("DDPRUN_RELEASE_DIST") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "..", "dist"), f"ddprun-{version()}-image.tar")
        if not os.path.isfile(archive):
            raise AssertionError(f"{archive} is missing: run scripts/release.sh first")
        cls.tag = f"localhost/ddprun-release-test:{os.getpid()}"
        out = podman("load", "-q", "-i", archive, timeout=600)
        loaded = out.stdout.strip().split(":", 1)[1].strip() if ":" in out.stdout else ""
        # An OCI archive without a name loads as its digest; tag it for this test either way.
        podman("tag", loaded or out.stdout.strip(), cls.tag)
        cls.net = f"ddprun-release-test-{os.getpid()}"
        podman("network", "create", cls.net)
        subnet = json.loads(podman("network", "inspect", cls.net).stdout)[0]["subnets"][0]["subnet"]
        prefix = subnet.split("/")[0].rsplit(".", 1)[0]
        cls.ips = [f"{prefix}.{10 + i}" for i in range(3)]

    @classmethod
    def tearDownClass(cls):
        podman("network", "rm", "-f", cls.net, check=False)
        podman("rmi", cls.tag, check=False)

    def setUp(self):
        super().setUp()
        shutil.copy(DDP_TRAIN, os.path.join(self.tmp, "ddp_train.py"))
        self.containers = []
        self.addCleanup(self.remove_containers)

    def remove_containers(self):
        if self.containers:
            podman("rm", "-f", "-t", "0", *self.containers, check=False)

    def start(self, name, ip, env, argv):
        """A detached container on the test's network at ip, /shared = self.tmp, master's name in /etc/hosts."""
        name = f"{self.net}-{name}"
        args = ["run", "-d", "--name", name, "--network", self.net, "--ip", ip, "--hostname", name,
                "--add-host", f"train-node-0-0.train:{self.ips[0]}", "-v", f"{self.tmp}:/shared"]
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        podman(*args, self.tag, *argv)
        self.containers.append(name)
        return name

    def wait_for_status(self, status_argv, deadline_s):
        """Runs `ddprun status ... --json` in a third container until both nodes run; returns the document."""
        deadline = time.monotonic() + deadline_s
        last = ""
        while time.monotonic() < deadline:
            out = podman("run", "--rm", "--network", self.net, "--ip", self.ips[2],
                         "--add-host", f"train-node-0-0.train:{self.ips[0]}", self.tag,
                         "ddprun", "status", *status_argv, "--json", check=False, timeout=120)
            last = out.stdout + out.stderr
            if out.returncode == 0:
                doc = json.loads(out.stdout)
                states = [n.get("state") for n in doc.get("nodes", [])]
                if doc.get("state") == "running" and states == ["running", "running"]:
                    return doc
            for c in self.containers:  # a job that already ended will never be seen running
                state = podman("inspect", "-f", "{{.State.Status}}", c).stdout.strip()
                self.assertEqual(state, "running", f"{c} ended early:\n" + podman("logs", c).stderr[-4000:])
            time.sleep(1)  # a poll interval, not a synchronisation: the loop waits for the state above
        self.fail(f"ddprun status never saw both nodes running; last answer:\n{last[-3000:]}")

    def finish(self, out_dir):
        """Lets the training stop (its --stop-file), then waits for both nodes; both must exit 0."""
        with open(os.path.join(self.tmp, "stop"), "w"):
            pass
        for c in self.containers:
            code = podman("wait", c, timeout=JOB_TIMEOUT).stdout.strip()
            self.assertEqual(code, "0", f"{c} exited {code}:\n" + podman("logs", c).stderr[-4000:])
        self.check_ddp_job(out_dir, world_size=2)

    def train_args(self, out):
        os.makedirs(os.path.join(self.tmp, out), exist_ok=True)
        return ["/shared/ddp_train.py", "--steps", "100000", "--stop-file", "/shared/stop", "--stop-every", "5",
                "--out", f"/shared/{out}"]

    def test_labels_name_the_release(self):
        labels = json.loads(podman("image", "inspect", self.tag).stdout)[0]["Labels"]
        line = self.version_line()
        self.assertEqual(labels["org.opencontainers.image.version"], version())
        self.assertEqual(labels["org.opencontainers.image.revision"], line.split("(commit ")[1].rstrip(")"))
        out = podman("run", "--rm", "--network", "none", self.tag, "sh", "-c",
                     "ddprun --version; torchrun --version; readlink /usr/local/bin/torchrun")
        self.assertEqual(out.stdout.split("\n")[:3], [line, line, "ddprun"])

    def test_static_job_as_kubeflow_trainer_starts_it(self):
        for rank in range(2):
            env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(rank),
                   "PET_MASTER_ADDR": "train-node-0-0.train", "PET_MASTER_PORT": "29500"}
            self.start(f"static{rank}", self.ips[rank], env, ["torchrun", *self.train_args("out")])
        doc = self.wait_for_status(["--master_addr", self.ips[0], "--master_port", "29500"], JOB_TIMEOUT)
        self.assertEqual(len(doc["nodes"]), 2)
        self.finish(os.path.join(self.tmp, "out"))

    def test_elastic_job(self):
        for rank in range(2):
            self.start(f"elastic{rank}", self.ips[rank], {},
                       ["ddprun", "--nnodes", "2:2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                        "--rdzv_endpoint", f"{self.ips[0]}:29400", "--rdzv_id", "release-elastic",
                        *self.train_args("out")])
        self.wait_for_status(["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{self.ips[0]}:29400",
                              "--rdzv_id", "release-elastic"], JOB_TIMEOUT)
        self.finish(os.path.join(self.tmp, "out"))


if __name__ == "__main__":
    unittest.main()
