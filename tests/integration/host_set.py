"""Which set of scripts/test-cluster.sh's network-namespace hosts this test process uses: DDPRUN_TEST_HOSTS=S
(0-9, default 0; tests/integration/CMakeLists.txt gives each netns module its set, so that modules of different
sets run at once). Set 0 is ddprun-h1.. at 10.99.0.1..; set S > 0 is ddprun-sSh1.. at 10.99.S.1... The hosts'
own names (gethostname) are ddprun-hI in every set. Users of a set hold its lock file meanwhile
(ddprun_testlib.hold_cluster_lock_until_exit). Standard library only."""
import os

HOST_SET = int(os.environ.get("DDPRUN_TEST_HOSTS") or "0")
if not 0 <= HOST_SET <= 9:
    raise ValueError(f"DDPRUN_TEST_HOSTS must be a host set 0..9, not {HOST_SET}")
# One user of a set at a time (a netns test module, a Slurm test cluster; another checkout's run too).
CLUSTER_LOCK = "/tmp/ddprun-test-cluster.lock" if HOST_SET == 0 else f"/tmp/ddprun-test-cluster-s{HOST_SET}.lock"


def host_address(host):
    """Host `host`'s IPv4 address (its eth0)."""
    return f"10.99.{HOST_SET}.{host}"


def host_namespace(host):
    """The network namespace of host `host` (`ip netns exec NAME ...`)."""
    return f"ddprun-h{host}" if HOST_SET == 0 else f"ddprun-s{HOST_SET}h{host}"
