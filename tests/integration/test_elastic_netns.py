"""Elastic rendezvous (c10d backend) on real hosts: network namespaces with their own IPv4 addresses.

scripts/test-cluster.sh makes hosts ddprun-h1..h4 (10.99.0.1..4 on bridge ddprun-br0); every agent runs on its
own host and the endpoint is host 1's address, so host 1's agent hosts the store (is_host detection) and the
others reach it over the bridge. Cases (torch: with real gloo DDP workers, scripts/examples/ddp_train.py, and
every torch version; light: with the light worker, once - ddprun_testlib.torch_subject):
  - a node dies (its agent is SIGKILLed mid-run): the survivors re-form with 2 nodes, resume from the
    checkpoint and finish; nothing of the dead host survives (torch: gloo across hosts, torch's ranks set up
    again in a smaller world);
  - a node arrives mid-run: the next round has 4 nodes (8 workers) and every agent finishes (light);
  - an endpoint nobody serves: exit code 4 soon after join_timeout, with a message naming the endpoint (light:
    no worker starts);
  - the workers' interpreter on a host (with the torch 2.6 root: scripts/torch26-root.sh `run` under `ip netns
    exec`) keeps its pid and directory and sees the host's name and eth0 address, and the expected torch (torch).

The hosts, their set-up and what the tests need: tests/integration/netns_hosts.py. The store host's loss:
test_store_failover_netns.py.
"""
import os
import signal
import subprocess
import time
import unittest

import ddprun_testlib
from ddprun_testlib import PYTHON, torch_subject
from netns_hosts import CLUSTER, NPROC, TRAIN, HostAgent, HostsTestCase, address, host_pids, rounds_of, wait_until


class ElasticOnHosts(HostsTestCase):
    @torch_subject
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
        self.wait_for_training(agents[0], nodes=2)
        self.stop_training()
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
        self.wait_for_training(agents[0], nodes=4)
        self.stop_training()
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

    @torch_subject
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
        python, script, env = ddprun_testlib.training_worker(self.worker, TRAIN)
        agent = HostAgent(2, ["--nnodes", "1:2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                              "--rdzv_endpoint", endpoint, "--rdzv_id", self.run_id,
                              "--rdzv_conf", "join_timeout=2", "--python", python, script],
                          self.path("agent-unreachable.log"), env=env)
        self.agents.append(agent)
        rc = agent.wait(60)
        elapsed = time.monotonic() - agent.started
        self.assertEqual(rc, 4, agent.describe())
        self.assertIn(endpoint, agent.log(), agent.describe())
        self.assertLess(elapsed, 2 + 10, f"join_timeout=2 but ddprun took {elapsed:.1f} s\n"
                                         f"{agent.describe()}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
