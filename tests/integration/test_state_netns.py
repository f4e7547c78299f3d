"""Training state copied between nodes (ddprun --state_memory; docs/state.md, "Between agents") on real hosts
(network namespaces, tests/integration/netns_hosts.py): real gloo DDP workers (scripts/examples/ddp_train.py
--state-every 10, torch 1.13 and 2.6), c10d rendezvous, 2 ranks per host.
  - 3 hosts and a hot spare, the job's secret on (the copies authenticated): host 2's agent is SIGKILLed mid-run;
    the spare takes its node rank and restores its ranks' state from the buddy (the next node) before its
    workers start; every rank resumes at the same step and the job ends with parameters bit for bit those of a
    run of 3 hosts that never stopped. A stranger without the secret is refused by an agent's state server.
  - a node and its buddy lost together (hosts 2 and 3 of 3; two spares on host 4): the ranks whose copies were
    on the survivor are restored, the others are not, load() returns None on every rank, the script falls back
    to its disk checkpoint and the job goes on to the end.
  - the SDK's C++ trainer (ddprun::sdk::state, $EXAMPLE_TRAIN; no torch import, so it runs once): host 2's agent
    SIGKILLed with a spare waiting; the spare restores the C++ writer's versions from the buddy, every rank
    resumes at the same step, the parameters end bit for bit those of the same job that never stopped.
No timing is asserted (scripts/bench-state.sh measures it).
"""
import os
import re
import signal
import subprocess
import unittest

from netns_hosts import CLUSTER, NPROC, TRAIN, HostAgent, HostsTestCase, address, host_pids, wait_until
from ddprun_testlib import PYTHON, torch_subject

STEPS = 300
EXAMPLE = os.environ.get("EXAMPLE_TRAIN", "")  # ddprun-example-train (registered only with libtorch)
SDK_DONE = re.compile(r"^(?:\[default0\]:)?done: 6 ranks, .* params_fnv1a=([0-9a-f]{16})$", re.M)
SDK_RESUMED = re.compile(r"rank (\d+): resumed from ddprun::sdk::state at step (\d+)")
ROUND_LINE = re.compile(r"\] ddprun \S+ info: round (\d+): node (\d+)/(\d+), ranks (\d+)\.\.(\d+) of (\d+),")
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=90"


def node_ranks(agent):
    return [int(m[2]) for m in ROUND_LINE.finditer(agent.log())]


class StateAcrossNodes(HostsTestCase):
    reference = None  # params_sha256 of the 3-host job that never stopped

    def job(self, host, port, nnodes, endpoint=None, agent_args=(), extra=(), steps=STEPS):
        args = ["--nnodes", nnodes, "--nproc_per_node", str(NPROC), "--rdzv_backend", "c10d",
                "--rdzv_endpoint", endpoint or f"{address(1)}:{port}", "--rdzv_id", self.run_id,
                "--rdzv_conf", RDZV_CONF, "--max_restarts", "3", "--tee", "3", "--state_memory", "64M",
                "--log_dir", self.path(f"logs-h{host}-{len(self.agents)}"), *agent_args,
                "--python", PYTHON, TRAIN, "--steps", str(steps), "--hidden", "32", "--batch", "16",
                "--log-every", "10", "--state-every", "10", "--out", self.path("out"), *extra]
        agent = HostAgent(host, args, self.path(f"agent-h{host}-{len(self.agents)}.log"))
        self.agents.append(agent)
        return agent

    def results(self, agents, world):
        self.assert_exit_zero(agents)
        return self.assert_results(world)

    def secret(self):
        path = self.path("job.secret")
        with open(path, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.chmod(path, 0o600)
        return path

    def uninterrupted(self):
        if StateAcrossNodes.reference is None:
            agents = [self.job(h, 29451, "3") for h in (1, 2, 3)]
            results = self.results(agents, 3 * NPROC)
            StateAcrossNodes.reference = results[0]["params_sha256"]
            for agent in agents:
                agent.proc.wait()
            self.agents.clear()
            for name in os.listdir(self.path("out")):
                os.unlink(self.path("out", name))
        return StateAcrossNodes.reference

    def kill_host_2(self, agents):
        """SIGKILLs host 2's agent (agents[1]; its workers die with it); returns the node rank it had."""
        victim = agents[1]
        lost = node_ranks(victim)[-1]
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        wait_until(lambda: not host_pids(2), 15, "host 2's workers to die with their agent")
        return lost

    def wait_for_step(self, agent, step):
        wait_until(lambda: re.search(rf"step {step}/{STEPS} loss", agent.log()), 120,
                   f"rank 0 to log step {step}", self.describe_all)

    @torch_subject
    def test_a_spare_restores_a_killed_nodes_ranks_from_its_buddy(self):
        reference = self.uninterrupted()
        secret = ("--rdzv_secret_file", self.secret())
        slow = ("--step-sleep", "0.05")
        agents = [self.job(h, 29452, "3", agent_args=secret, extra=slow) for h in (1, 2, 3)]
        self.wait_for_training(agents[0], nodes=3)
        spare = self.job(4, 29452, "3", agent_args=secret, extra=slow)
        wait_until(lambda: "waits as a hot spare" in spare.log(), 90, "host 4 to wait as a spare", self.describe_all)
        self.wait_for_step(agents[0], 60)
        self.assert_stranger_refused(agents[2])
        lost = self.kill_host_2(agents)
        survivors = [agents[0], agents[2], spare]
        results = self.results(survivors, 3 * NPROC)
        self.assertEqual(node_ranks(spare), [lost], spare.describe())
        self.assert_restored(spare, lost)
        resumed = {int(s) for a in survivors for s in re.findall(r"resumed from ddprun.state at step (\d+)", a.log())}
        self.assertEqual(len(resumed), 1, f"ranks resumed at different steps: {resumed}\n{self.describe_all()}")
        self.assertEqual({r["start_step"] for r in results}, resumed, results)
        self.assertEqual({r["params_sha256"] for r in results}, {reference},
                         f"parameters differ from the uninterrupted run's\n{self.describe_all()}")

    def sdk_job(self, host, port, tag):
        args = ["--nnodes", "3", "--nproc_per_node", str(NPROC), "--rdzv_backend", "c10d", "--rdzv_endpoint",
                f"{address(1)}:{port}", "--rdzv_id", f"{self.run_id}-{tag}", "--rdzv_conf", RDZV_CONF,
                "--max_restarts", "3", "--tee", "3", "--state_memory", "64M",
                "--log_dir", self.path(f"logs-{tag}-h{host}"), "--no_python", EXAMPLE, "--threads", "1",
                "--steps", "200", "--hidden", "64", "--log-every", "10", "--state-every", "10",
                "--step-sleep-ms", "30"]
        agent = HostAgent(host, args, self.path(f"agent-{tag}-h{host}.log"))
        self.agents.append(agent)
        return agent

    def sdk_params(self, agents):
        self.assert_exit_zero(agents)
        done = [m for a in agents for m in SDK_DONE.findall(a.log())]
        self.assertEqual(len(done), 1, self.describe_all())
        return done[0]

    @unittest.skipUnless(EXAMPLE, "EXAMPLE_TRAIN must name ddprun-example-train (a build with libtorch)")
    def test_the_sdk_trainers_ranks_restore_on_a_spare_from_the_buddy(self):
        reference = self.sdk_params([self.sdk_job(h, 29453, "ref") for h in (1, 2, 3)])
        self.agents.clear()
        agents = [self.sdk_job(h, 29454, "run") for h in (1, 2, 3)]
        wait_until(lambda: any(re.search(r"step 60/200 loss", a.log()) for a in agents), 120,
                   "the trainer to reach step 60", self.describe_all)
        spare = self.sdk_job(4, 29454, "run")
        wait_until(lambda: "waits as a hot spare" in spare.log(), 90, "host 4 to wait as a spare", self.describe_all)
        lost = self.kill_host_2(agents)
        survivors = [agents[0], agents[2], spare]
        params = self.sdk_params(survivors)
        self.assert_restored(spare, lost)
        resumed = {int(r): int(s) for a in survivors for r, s in SDK_RESUMED.findall(a.log())}
        self.assertEqual(sorted(resumed), list(range(3 * NPROC)), self.describe_all())
        self.assertEqual(len(set(resumed.values())), 1, f"ranks resumed at different steps: {resumed}")
        self.assertEqual(params, reference, f"parameters differ from the uninterrupted run's\n{self.describe_all()}")

    def assert_restored(self, spare, lost):
        """The spare restored node rank `lost`'s ranks from the buddy."""
        for rank in range(NPROC * lost, NPROC * (lost + 1)):
            self.assertRegex(spare.log(), rf"restored rank {rank}'s state \(newest step \d+", spare.describe())

    def assert_stranger_refused(self, agent):
        """A client on host 4 without the secret opens the protocol with agent's state server: refused."""
        port = int(re.search(r"keeps the copies of the previous node's on port (\d+)", agent.log())[1])
        probe = self.path("probe.py")
        with open(probe, "w") as f:
            f.write(PROBE)
        done = subprocess.run(["bash", CLUSTER, "exec", "4", PYTHON, probe, address(agent.host), str(port)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        self.assertIn("error this agent admits only the job's agents", done.stdout, done.stdout + done.stderr)
        wait_until(lambda: f"refused the client at {address(4)}" in agent.log(), 10, "the refusal in the agent's log",
                   agent.describe)

    def test_a_node_and_its_buddy_lost_together_fall_back_to_the_disk_checkpoint(self):
        # 3 nodes: any two are a node and its buddy. Hosts 2 and 3 go; two spares on host 4 take their places.
        # The ranks whose copies were on the survivor are restored, the others have none: load() is None on
        # every rank, and the script resumes from its disk checkpoint.
        extra = ("--step-sleep", "0.05", "--checkpoint", self.path("checkpoint.pt"), "--save-every", "20")
        agents = [self.job(h, 29453, "3", extra=extra) for h in (1, 2, 3)]
        self.wait_for_training(agents[0], nodes=3)
        spares = [self.job(4, 29453, "3", extra=extra) for _ in range(2)]
        for spare in spares:
            wait_until(lambda: "waits as a hot spare" in spare.log(), 90, "a spare on host 4", self.describe_all)
        self.wait_for_step(agents[0], 60)
        for agent in agents[1:]:
            agent.proc.send_signal(signal.SIGKILL)
        for agent in agents[1:]:
            agent.proc.wait(timeout=10)
        results = self.results([agents[0], *spares], 3 * NPROC)
        spare_logs = "".join(s.log() for s in spares)
        # Two of the four lost ranks had their copies on the survivor. Counted by rank: a dead node that still
        # joined the first round after the kill makes the spares try once more in the round after it.
        self.assertEqual(len(set(re.findall(r"no node holds a version of rank (\d)'s state", spare_logs))), 2,
                         self.describe_all())
        self.assertEqual(len(set(re.findall(r"restored rank (\d)'s state", spare_logs))), 2, self.describe_all())
        log = agents[0].log()
        self.assertRegex(log, r"ddprun.state: nothing to resume from \(rank \d has no version on this node\)",
                         self.describe_all())
        self.assertRegex(log, r"resumed from \S+checkpoint.pt at step \d+", self.describe_all())
        self.assertTrue(all(r["identical"] for r in results), results)


# A client without the job's secret: the opening of agent/state/state_wire.h with an empty nonce; prints the
# server's answer.
PROBE = r"""
import socket, struct, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
def frame(b): s.sendall(struct.pack("<I", len(b)) + b)
def read(n):
    out = b""
    while len(out) < n:
        got = s.recv(n - len(out))
        if not got: raise SystemExit("closed")
        out += got
    return out
def recv_frame(): return read(struct.unpack("<I", read(4))[0])
s.sendall(b"DDPRSTX1"); frame(b"")
recv_frame(); recv_frame(); frame(b"")
print(recv_frame().decode())
"""


if __name__ == "__main__":
    unittest.main(verbosity=2)
