"""What tests/integration/test_slurm.py shares about the test Slurm cluster (scripts/slurm-cluster.sh): its paths,
the environment a job is submitted with, a command runner, and what a job left on the hosts. Standard library
only; run with the interpreter of the test (host torch 1.13 or the torch 2.6 root's)."""
import glob
import os
import subprocess

import ddprun_testlib
import host_set

REPO = os.environ.get("REPO") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDPRUN = os.environ.get("DDPRUN") or os.path.join(REPO, "build", "launcher", "ddprun")
SLURM_CLUSTER = os.path.join(REPO, "scripts", "slurm-cluster.sh")
TEST_CLUSTER = os.path.join(REPO, "scripts", "test-cluster.sh")  # the hosts under the cluster: `exec N CMD`
STATIC = os.path.join(REPO, "scripts", "examples", "sbatch-static.sh")
ELASTIC = os.path.join(REPO, "scripts", "examples", "sbatch-elastic.sh")
TRAIN = os.path.join(REPO, "scripts", "examples", "ddp_train.py")
HOSTLIST_TEST = os.path.join(REPO, "tests", "launcher", "hostlist_test.cc")
SLURM_DIR = "/tmp/ddprun-slurm"  # slurm-cluster.sh's default state directory
SLURM_CONF = os.path.join(SLURM_DIR, "slurm.conf")
HOSTS = 2
INSTALL_TIMEOUT = 300  # apt-get of slurm-wlm and munge on a fresh machine
UP_TIMEOUT = 420  # slurm-cluster.sh up: DDPRUN_SLURM_START_TIMEOUT (180 s) per wait, and a margin
JOB_TIMEOUT = 180  # seconds: bound for one job (a 2x2 torch job takes ~10-40 s on a loaded 2-core machine)
TRAIN_ARGS = ["--hidden", "32", "--batch", "16", "--log-every", "10"]
EXIT_SLURM_INTERRUPTED = 75  # launcher/slurm/slurm_env.h, docs/slurm.md


def wait_until(predicate, timeout, what, describe=lambda: ""):
    return ddprun_testlib.wait_until(predicate, timeout, what, describe, interval=0.2)


def slurm_env(worker="torch", **extra):
    """The environment a job is submitted with: the examples' variables for `worker` ("torch": ddp_train.py with
    PYTHON; "light": the light worker, ddprun_testlib.training_worker), and `extra`."""
    python, train, worker_env = ddprun_testlib.training_worker(worker, TRAIN)
    env = dict(os.environ, SLURM_CONF=SLURM_CONF, DDPRUN=DDPRUN, DDPRUN_PYTHON=python, GLOO_SOCKET_IFNAME="eth0",
               NPROC_PER_NODE="2", TRAIN=train, **worker_env)
    env.update(extra)
    return env


def run(cmd, env=None, timeout=60, check=True):
    done = subprocess.run(cmd, env=env or slurm_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}")
    return done


def daemon_pids():
    """The pids of slurm-cluster.sh's daemons (slurmd, slurmctld, munged)."""
    pids = set()
    for f in glob.glob(os.path.join(SLURM_DIR, "*.daemon")) + [os.path.join(SLURM_DIR, "munge", "munged.pid")]:
        try:
            with open(f) as fh:
                pids.add(int(fh.read().strip()))
        except (OSError, ValueError):
            pass
    return pids


def host_job_processes(host):
    """Processes on a test host other than its slurmd: what a job left behind."""
    done = subprocess.run(["ip", "netns", "pids", host_set.host_namespace(host)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    pids = {int(p) for p in done.stdout.split()} - daemon_pids()
    out = []
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            out.append(f"{pid} {cmd}")
        except OSError:
            pass
    return out


def processes_mentioning(text):
    """Every process (any namespace) whose command line contains `text`."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{d} {cmd.strip()}")
    return found
