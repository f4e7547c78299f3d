"""Unhealthy and flapping nodes on real hosts (network namespaces), with the jobs of test_multinode_recovery_netns.py
(c10d, --prestart). What is tested is the agents' and the rendezvous' decisions, not the workers' torch: host only,
with the light worker (light_train.py) but where SPARE_AT_THE_END says otherwise.
  - an unhealthy node (its --health_check fails after a crash): with a spare waiting, the spare takes its node
    rank, the restart stays counted, and once healthy the node comes back as a spare (which exits 0 when the job
    ends without it); without a spare in the range 2:3, the job goes on with 2 nodes and the unhealthy agent
    exits 8 after --health_check_attempts;
  - a flapping node (its rank crashes in two attempts in a row) sits out while a spare takes its place;
  - a node whose GPU memory stays held after its rank crashed (the stand-in NVML) waits for it before its
    restart while its heartbeats go on: its neighbour never declares it lost (light workers: no torch).
No timing is asserted.
"""
import json
import os
import time
import unittest

from netns_hosts import NPROC, RDZV_CONF, HostAgent, HostsTestCase, address, wait_until
from test_multinode_recovery_netns import RecoveryJob, rounds


# Both tests below end the job while a node waits as a spare, which must then exit 0. With the light worker
# (the job ends within a second of the spare's arrival) that spare exited 4 in 2 of 4 runs of the flapping test
# and 1 of 9 of the unhealthy one: "the job running with this --rdzv_id ... ended (the store went away:
# WAIT|GET '.../r<N>/stop': lost the connection to the store ...)" - the store's host stopped its store
# (StoreServer::stop closes every connection at once) between the done stop's SET and the spare's reading of
# it: a launcher race, reported (issue 43's CI work). It has not been seen with torch workers, whose job takes
# longer to end, so these two keep them until it is fixed.
SPARE_AT_THE_END = "torch"
# Those two torch cases lose no node: a heartbeat timeout of 10 s instead of 3 keeps a machine loaded by their
# torch workers (the flapping test failed once at load ~25) from dropping a node whose agent was only slow to be
# scheduled, which is not what they test.
TOLERANT_RDZV_CONF = RDZV_CONF.replace("keep_alive_max_attempt=3", "keep_alive_max_attempt=10")
assert TOLERANT_RDZV_CONF != RDZV_CONF


class NodeHealth(RecoveryJob):
    def test_an_unhealthy_node_stands_aside_for_a_spare_and_comes_back_as_one(self):
        self.worker, self.rdzv_conf = SPARE_AT_THE_END, TOLERANT_RDZV_CONF
        agents, spare = self.start_with_spare(29416, self.crash_on_demand(),
                                              lambda h: self.health_check(h, 2, "--health_check_attempts", "1000"))
        sick = agents[1]
        sick_rank = rounds(sick)[-1][1]
        self.make("sick")
        self.make("crash")
        wait_until(lambda: len(rounds(spare)) == 1, 90, "the spare to take a place", self.describe_all)
        self.assertEqual(rounds(spare)[0][1], sick_rank, spare.describe())
        self.assertIn("this node is unhealthy: --health_check", sick.log(), sick.describe())
        os.unlink(self.path("sick"))
        wait_until(lambda: "this node is healthy again" in sick.log()
                   and sick.log().count("waits as a hot spare") >= 1, 60, "host 2 back as a spare", self.describe_all)
        survivors = [agents[0], agents[2]]
        self.wait_for_training(survivors + [spare], nodes=3)
        results = self.finish(survivors + [spare, sick], 3 * NPROC)  # the unused spare exits 0 too
        self.assertEqual(len(rounds(sick)), 1, sick.describe())
        self.assertIn("while this node waited as a hot spare", sick.log(), sick.describe())
        for agent in survivors:
            seen = rounds(agent)
            self.assertEqual(seen[-1][1], seen[0][1], f"a survivor's node rank changed: {seen}\n{agent.describe()}")
            # A node that stood aside alive is not lost: the restart stays counted.
            self.assertIn("restarting the worker group (1 of 3 restarts)", agent.log(), agent.describe())
            self.assertNotIn("the restart is charged to their loss", agent.log(), agent.describe())
        self.assertEqual(results[0]["attempt"], 1, results)

    def test_an_unhealthy_node_without_a_spare_leaves_an_elastic_job_and_exits_8(self):
        agents = [self.start(h, 29417, "2:3", self.crash_on_demand(),
                             self.health_check(h, 3, "--health_check_attempts", "3")) for h in (1, 2, 3)]
        self.wait_for_training(agents[0], nodes=3)
        sick = agents[2]
        self.make("sick")
        self.make("crash")
        self.assertEqual(sick.wait(90), 8, sick.describe())
        self.assertIn("failed 3 health checks in a row", sick.log(), sick.describe())
        self.wait_for_training(agents[:2], nodes=2)
        results = self.finish(agents[:2], 2 * NPROC)
        self.assertEqual(len(rounds(sick)), 1, sick.describe())
        self.assertEqual(results[0]["attempt"], 1, results)

    def test_a_flapping_node_sits_out_while_a_spare_runs(self):
        # Rank 3 crashes in attempts 0 and 1: its node's agent caused two failures and sits out (the cooldown)
        # while the spare takes its place; after its cooldown it waits as a spare.
        self.worker, self.rdzv_conf = SPARE_AT_THE_END, TOLERANT_RDZV_CONF
        flapping = ("--fail-rank", "3", "--fail-step", "15", "--fail-until-attempt", "2")
        agents, spare = self.start_with_spare(29418, flapping)
        wait_until(lambda: len(rounds(spare)) == 1, 300, "the spare to take a place", self.describe_all)
        out = [a for a in agents if "keeping this node out for" in a.log()]
        self.assertEqual(len(out), 1, self.describe_all())
        self.assertEqual(rounds(spare)[0][1], rounds(out[0])[-1][1], self.describe_all())
        wait_until(lambda: "waits as a hot spare" in out[0].log(), 60, "the flapping node to wait as a spare",
                   self.describe_all)
        self.wait_for_training(agents + [spare], nodes=3)
        results = self.finish(agents + [spare], 3 * NPROC)
        self.assertEqual(len(rounds(out[0])), 2, out[0].describe())
        for agent in agents:
            if agent is not out[0]:
                self.assertIn("restarting the worker group (2 of 3 restarts)", agent.log(), agent.describe())
        self.assertEqual(results[0]["attempt"], 2, results)


class GpuMemoryWait(HostsTestCase):
    """A 2-host c10d job of light workers (rank_worker.py); host 2's agent reads its GPUs through the stand-in
    NVML (tests/bin/fake_nvml.cc), whose state file the test writes."""

    PORT = 29419

    def start_agent(self, host, rules, env=None, agent_args=()):
        spec = json.dumps({"fake_worker": os.environ["FAKE_WORKER"], "rules": rules})
        args = ["--nnodes", "2", "--nproc_per_node", str(NPROC), "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"{address(1)}:{self.PORT}", "--rdzv_id", self.run_id, "--rdzv_conf", RDZV_CONF,
                "--max_restarts", "3", "--log_dir", self.path(f"logs-h{host}"), *agent_args,
                "--python", "/usr/bin/python3", os.path.join(os.path.dirname(__file__), "rank_worker.py"), spec]
        agent = HostAgent(host, args, self.path(f"agent-h{host}.log"), env=env)
        self.agents.append(agent)
        return agent

    def test_a_restart_that_waits_for_gpu_memory_keeps_its_node_in_the_job(self):
        gpus = self.path("gpus")
        with open(gpus, "w") as f:
            f.write("GPU-aaaa 100 8000 ok\nGPU-bbbb 100 8000 ok\n")
        done = self.path("done")
        # Attempt 0: host 2's local rank 0 crashes once `go` exists, every other rank runs until stopped;
        # attempt 1: every rank notes itself and exits 0.
        finish = {"attempt": 1, "append": done}
        host1 = self.start_agent(1, [finish, {"attempt": 0, "args": ["--hang"]}])
        host2 = self.start_agent(
            2, [finish, {"attempt": 0, "rank": 0, "wait_for": self.path("go"), "exit": 1},
                {"attempt": 0, "args": ["--hang"]}],
            env={"DDPRUN_NVML_LIBRARY": os.environ["FAKE_NVML"], "DDPRUN_FAKE_NVML_STATE": gpus},
            agent_args=("--gpu_memory_wait", "60"))
        wait_until(lambda: all(rounds(a) for a in (host1, host2)), 60, "round 0 on both hosts", self.describe_all)
        self.assertIn("NVML sees 2 GPUs", host2.log(), host2.describe())
        # The crashed generation's GPU memory stays held (an escaped descendant, another tenant) for 3 times
        # the heartbeat timeout (3 s here): long enough that a node without heartbeats would be dropped.
        with open(gpus, "w") as f:
            f.write("GPU-aaaa 6000 8000 ok\nGPU-bbbb 100 8000 ok\n")
        with open(self.path("go"), "w"):
            pass
        wait_until(lambda: "restarting the worker group" in host2.log(), 30, "host 2 to restart",
                   self.describe_all)
        time.sleep(9)  # holds the condition under test (memory held), not a synchronisation
        self.assertNotIn("waited", host2.log(), "the wait must still be going on\n" + host2.describe())
        with open(gpus, "w") as f:
            f.write("GPU-aaaa 200 8000 ok\nGPU-bbbb 100 8000 ok\n")
        for agent in (host1, host2):
            self.assertEqual(agent.wait(60), 0, self.describe_all())
        self.assertIn("for the previous workers' GPU memory to be released", host2.log(), host2.describe())
        for agent in (host1, host2):
            self.assertNotIn("stopped heartbeating", agent.log(), self.describe_all())
            self.assertEqual([r[0] for r in rounds(agent)], [0, 1], agent.describe())
            self.assertIn("restarting the worker group (1 of 3 restarts)", agent.log(), agent.describe())
        with open(done) as f:
            self.assertEqual(sorted(f.read().split("\n")[:-1]), sorted(["rank0 attempt1", "rank1 attempt1"] * 2))


if __name__ == "__main__":
    unittest.main(verbosity=2)
