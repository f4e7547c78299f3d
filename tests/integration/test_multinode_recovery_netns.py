"""Multi-node recovery on real hosts (network namespaces, tests/integration/netns_hosts.py): no fixed wait after a
failure, hot spares, ranks kept. c10d rendezvous; every agent runs with --prestart. Cases:
  - a worker crashes (--nnodes 3, and the elastic range 2:3): every node restarts in the next round with the same
    node ranks, one restart counted, the job finishes with identical parameters - with --nnodes 3, real gloo DDP
    workers (scripts/examples/ddp_train.py) and every torch version: the standbys that imported torch become the
    next attempt's DDP ranks; the elastic range and the cases below with the light worker (light_train.py),
    once: they are the agents' and the rendezvous' decisions;
  - 4 hosts for --nnodes 3: the 4th waits as a hot spare ("hot spare" in its log); host 2's agent is SIGKILLed:
    the spare takes its node rank in the next round, the survivors keep theirs, the world stays 6 ranks, and no
    restart is counted against --max_restarts (a lost node is not the job's failure);
  - the same with host 2 frozen (SIGSTOP of its agent and workers): the survivors' heartbeats find it, the spare
    takes its place;
  - a crash loop (rank 3 crashes at the same step after every resume) under --max_no_progress_restarts 2: the
    first attempt made progress, the next two did not, and every agent exits 7 (do not requeue) with restarts
    left.
Unhealthy and flapping nodes: test_node_health_netns.py.
No timing is asserted (scripts/bench-multinode-recovery.sh measures it).
"""
import os
import re
import signal
import unittest

from ddprun_testlib import torch_subject
from netns_hosts import NPROC, HostsTestCase, host_pids, wait_until

# "round R: node N/NODES, ranks A..B of WORLD"
NODE_LINE = re.compile(r"\] ddprun \S+ info: round (\d+): node (\d+)/(\d+), ranks \d+\.\.\d+ of (\d+),")


def rounds(agent):
    """[(round, node rank, nodes, world size)] of every round the agent ran workers in."""
    return [tuple(int(g) for g in m.groups()) for m in NODE_LINE.finditer(agent.log())]


class RecoveryJob(HostsTestCase):
    """The jobs of these tests and their checks (no tests of its own; test_node_health_netns.py uses it too)."""

    def start(self, host, port, nnodes, extra=(), agent_args=()):
        return self.start_training(host, port, steps=2000, nnodes=nnodes, extra=extra,
                                   agent_args=("--prestart", *agent_args))

    def finish(self, agents, world_size):
        self.stop_training()
        self.assert_exit_zero(agents)
        return self.assert_results(world_size)

    def check_worker_crash(self, port, nnodes):
        agents = [self.start(h, port, nnodes, extra=("--fail-rank", "3", "--fail-step", "15",
                                                      "--fail-until-attempt", "1")) for h in (1, 2, 3)]
        wait_until(lambda: all(len(rounds(a)) >= 2 for a in agents), 120, "every agent in a second round",
                   self.describe_all)
        self.wait_for_training(agents[0], nodes=3)
        results = self.finish(agents, 3 * NPROC)
        for agent in agents:
            seen = rounds(agent)
            self.assertEqual(len(seen), 2, f"rounds {seen}\n{agent.describe()}")
            self.assertEqual([s[2:] for s in seen], [(3, 3 * NPROC)] * 2, agent.describe())
            self.assertEqual(seen[0][1], seen[1][1], f"node rank changed: {seen}\n{agent.describe()}")
            self.assertIn("restarting the worker group (1 of 3 restarts)", agent.log(), agent.describe())
        self.assertEqual(results[0]["attempt"], 1, results)


    def health_check(self, host, sick_host, *more):
        """--health_check that fails on `sick_host` while the file sick exists."""
        return ("--health_check", f"test ! -e {self.path('sick')}", "--health_check_interval", "0.5",
                *more) if host == sick_host else ()

    def crash_on_demand(self):
        """ddp_train.py's rank 0 crashes once after the file crash appears (make_crash)."""
        return ("--fail-rank", "0", "--fail-file", self.path("crash"))

    def make(self, name):
        with open(self.path(name), "w"):
            pass


    def start_with_spare(self, port, extra=(), agent_args=lambda host: ()):
        agents = [self.start(h, port, "3", extra, agent_args(h)) for h in (1, 2, 3)]
        self.wait_for_training(agents[0], nodes=3)
        spare = self.start(4, port, "3", extra)
        wait_until(lambda: "waits as a hot spare" in spare.log(), 60, "host 4 to wait as a spare",
                   self.describe_all)
        self.assertEqual(rounds(spare), [], spare.describe())
        return agents, spare

    def check_spare_took_over(self, survivors, spare, lost_rank):
        self.wait_for_training(survivors[0], nodes=3)
        results = self.finish(survivors + [spare], 3 * NPROC)
        self.assertEqual(len(rounds(spare)), 1, spare.describe())
        self.assertEqual(rounds(spare)[0][1], lost_rank, f"the spare should take node rank {lost_rank}\n"
                                                         f"{spare.describe()}")
        for agent in survivors:
            seen = rounds(agent)
            self.assertGreaterEqual(len(seen), 2, agent.describe())
            self.assertEqual(seen[-1][1], seen[0][1], f"a survivor's node rank changed: {seen}\n{agent.describe()}")
            self.assertEqual(seen[-1][2:], (3, 3 * NPROC), agent.describe())
        for agent in survivors + [spare]:
            # A lost node is not the job's failure: nothing is counted against --max_restarts (a restart its
            # echo caused is given back in the next round).
            log = agent.log()
            counted = len(re.findall(r"restarting the worker group", log))
            given_back = len(re.findall(r"the restart is charged to their loss", log))
            self.assertEqual(counted, given_back, agent.describe())
        return results


class MultiNodeRecovery(RecoveryJob):
    @torch_subject
    def test_worker_crash_restarts_every_node_in_the_next_round(self):
        self.check_worker_crash(29411, "3")

    def test_worker_crash_in_an_elastic_range(self):
        self.check_worker_crash(29412, "2:3")

    def test_a_spare_replaces_a_killed_node_and_survivors_keep_their_ranks(self):
        agents, spare = self.start_with_spare(29413)
        victim = agents[1]
        lost_rank = rounds(victim)[-1][1]
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        wait_until(lambda: not host_pids(2), 15, "host 2's workers to die with their agent")
        self.check_spare_took_over([agents[0], agents[2]], spare, lost_rank)

    def test_a_spare_replaces_a_frozen_node(self):
        agents, spare = self.start_with_spare(29414)
        victim = agents[1]
        lost_rank = rounds(victim)[-1][1]
        frozen = host_pids(2)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            self.check_spare_took_over([agents[0], agents[2]], spare, lost_rank)
        finally:
            for pid in frozen:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.assertTrue(any(f"node {lost_rank} stopped heartbeating" in a.log() for a in (agents[0], agents[2])),
                        self.describe_all())


    def test_a_restart_loop_without_progress_stops_with_exit_7(self):
        crash_loop = ("--fail-rank", "3", "--fail-step", "15", "--fail-until-attempt", "100")
        agents = [self.start_training(h, 29415, steps=2000, nnodes="3", extra=crash_loop,
                                      agent_args=("--prestart", "--max_no_progress_restarts", "2"))
                  for h in (1, 2, 3)]
        for agent in agents:
            rc = agent.wait(240)
            self.assertEqual(rc, 7, f"host {agent.host}\n{self.describe_all()}")
        for agent in agents:
            # Attempt 0 reached step 16 (progress), attempts 1 and 2 resumed from step 10 and crashed at 16 again.
            self.assertEqual(len(rounds(agent)), 3, agent.describe())
            self.assertNotIn("restarting the worker group (3 of 3", agent.log(), agent.describe())
        self.assertTrue(any("2 failed attempt(s) in a row made no progress (step 16, previous attempt 16" in a.log()
                            for a in agents), self.describe_all())



if __name__ == "__main__":
    unittest.main(verbosity=2)
