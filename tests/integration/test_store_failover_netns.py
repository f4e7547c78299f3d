"""The loss of the host that serves the rendezvous store (c10d backend), on real hosts: network namespaces with
their own IPv4 addresses (tests/integration/netns_hosts.py). Checkpoints from rank 0. Cases:
  - 3 hosts, host 1 serves the store; every process of host 1 is SIGKILLed mid-run: hosts 2 and 3 move to
    host 2's standby store, re-form at once (not a restart) and finish with world 4 from the checkpoint - with
    real gloo DDP workers (scripts/examples/ddp_train.py) and every torch version: torch's ranks find the job's
    new store (MASTER_ADDR/PORT moved with it);
  - 4 hosts with --rdzv_endpoint listing all four; host 1, then the new store host (host 2) are killed: hosts
    3 and 4 finish; a node started again on host 1 with the same list finds the job on host 3 and joins it
    (the light worker, light_train.py: the agents' and the rendezvous' doing);
  - host 1 frozen (SIGSTOP of all its processes) for less than the heartbeat timeout: nothing happens; frozen
    for longer: hosts 2 and 3 move on without it, and host 1, thawed, says that the job moved and exits 4,
    leaving no process behind (the light worker).
The time from each kill to the survivors' workers running again (the workers' 'start' stamps) and training
again (their first step) is printed, not asserted (docs/benchmarks.md has the measured figures).
"""
import os
import re
import signal
import time
import unittest

from ddprun_testlib import torch_subject
from netns_hosts import (NPROC, HostsTestCase, address, host_pids, kill_host_processes, rounds_of,
                         wait_until)

HEARTBEAT_TIMEOUT = 3  # keep_alive_interval=1 x keep_alive_max_attempt=3 (netns_hosts.RDZV_CONF)


def signal_host(host, sig):
    for pid in host_pids(host):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class StoreFailoverOnHosts(HostsTestCase):
    def start_job(self, hosts, port, nnodes, steps=600, endpoint=None):
        return [self.start_training(h, port, steps, nnodes=nnodes, endpoint=endpoint,
                                    extra=("--stamp", self.path("stamps"))) for h in hosts]

    def stamps(self):
        """[(event, attempt, rank, unix seconds)] the workers wrote (ddp_train.py --stamp)."""
        try:
            with open(self.path("stamps")) as f:
                rows = [line.split() for line in f if line.strip()]
        except FileNotFoundError:
            return []
        return [(r[0], int(r[1]), r[2], int(r[3]) / 1e9) for r in rows if len(r) == 4 and r[1].isdigit()]

    def report_recovery(self, what, killed_at):
        """Prints how long after `killed_at` the first later attempt's workers ran and trained again."""
        later = [s for s in self.stamps() if s[3] > killed_at]
        starts = [s[3] for s in later if s[0] == "start"]
        steps = [s[3] for s in later if s[0] == "first-step"]
        started = f"{max(starts) - killed_at:.2f} s" if starts else "never"
        trained = f"{max(steps) - killed_at:.2f} s" if steps else "never"
        print(f"\n{what}: every worker running again {started} after the kill, training again {trained} "
              f"(heartbeat timeout {HEARTBEAT_TIMEOUT} s)", flush=True)

    def kill_host(self, host):
        killed_at = time.time()
        kill_host_processes(host)
        wait_until(lambda: not host_pids(host), 15, f"host {host}'s processes to die",
                   lambda: f"left on host {host}: {host_pids(host)}")
        return killed_at

    def assert_last_round(self, agent, nodes, rounds_before=None):
        """The agent's last round had `nodes` nodes, and no restart was counted for the store's loss."""
        log = agent.log()
        rounds = rounds_of(log)
        self.assertTrue(rounds, agent.describe())
        self.assertEqual(rounds[-1][1:], (nodes, nodes * NPROC), f"rounds {rounds}\n{agent.describe()}")
        if rounds_before is not None:
            self.assertEqual(len(rounds), rounds_before + 1, f"one re-form expected: {rounds}\n{agent.describe()}")
        self.assertNotIn("restarting the worker group", log, agent.describe())
        return rounds[-1][0]

    @torch_subject
    def test_survivors_outlive_the_store_host(self):
        agents = self.start_job((1, 2, 3), 29411, "2:3")
        self.wait_for_training(agents[0], nodes=3)
        wait_until(lambda: os.path.exists(self.path("checkpoint.pt")), 60, "the first checkpoint",
                   self.describe_all)
        rounds_before = len(rounds_of(agents[1].log()))
        killed_at = self.kill_host(1)
        self.wait_for_training(agents[1], nodes=2)
        self.stop_training()
        self.assert_exit_zero(agents[1:])
        self.report_recovery("store host killed (3 hosts)", killed_at)
        final = {self.assert_last_round(a, 2, rounds_before) for a in agents[1:]}
        self.assertEqual(len(final), 1, self.describe_all())
        # Rank 0 of the last round hosts the store: host 2 took over (its standby, on a free port: the endpoint
        # is no list), host 3 found it there.
        took_over = re.search(rf"this node \(({re.escape(address(2))}:\d+)\) hosts the job's store from now on",
                              agents[1].log())
        self.assertTrue(took_over, agents[1].describe())
        self.assertIn(f"the job moves to {took_over[1]}", agents[2].log(), agents[2].describe())
        self.assertIn(f"store {took_over[1]}", agents[2].log(), agents[2].describe())
        self.assertRegex(agents[1].log(), r"resumed from .*checkpoint\.pt at step [1-9]\d*", agents[1].describe())
        results = self.assert_results(2 * NPROC)
        self.assertEqual({results[0]["attempt"]}, final, results)

    def test_store_host_lost_twice_and_a_late_node_finds_the_job(self):
        port = 29412
        endpoints = ",".join(f"{address(h)}:{port}" for h in (1, 2, 3, 4))
        agents = self.start_job((1, 2, 3, 4), port, "2:4", steps=900, endpoint=endpoints)
        self.wait_for_training(agents[0], nodes=4)
        killed_at = self.kill_host(1)
        self.wait_for_training(agents[1], nodes=3)
        self.report_recovery("store host killed (4 hosts)", killed_at)
        killed_at = self.kill_host(2)
        self.wait_for_training(agents[2], nodes=2)
        self.report_recovery("new store host killed (3 hosts left)", killed_at)
        # The round's first live successor takes over: host 3 or 4, whichever joined the round before the
        # other (arrival order, not host number).
        takers = [h for h, a in ((3, agents[2]), (4, agents[3]))
                  if f"this node ({address(h)}:{port}) hosts the job's store from now on" in a.log()]
        self.assertEqual(len(takers), 1, self.describe_all())
        # Host 1 comes back with the same command line: the job is no longer where it started, the list finds it.
        late = self.start_training(1, port, 900, nnodes="2:4", endpoint=endpoints,
                                   extra=("--stamp", self.path("stamps")))
        self.wait_for_training(agents[2], nodes=3)
        self.stop_training()
        self.assert_exit_zero([late, *agents[2:]])
        self.assertIn(f"the job runs at {address(takers[0])}:{port}; joining it there", late.log(), late.describe())
        final = {self.assert_last_round(a, 3) for a in (late, *agents[2:])}
        self.assertEqual(len(final), 1, self.describe_all())
        results = self.assert_results(3 * NPROC)
        self.assertEqual({results[0]["attempt"]}, final, results)

    def test_a_frozen_store_host_is_waited_for_then_left_behind(self):
        agents = self.start_job((1, 2, 3), 29413, "2:3", steps=2500)
        self.wait_for_training(agents[0], nodes=3)
        # Frozen for half the heartbeat timeout: the job waits and goes on in the same round.
        signal_host(1, signal.SIGSTOP)
        time.sleep(HEARTBEAT_TIMEOUT / 2)
        signal_host(1, signal.SIGCONT)
        seen = len(agents[0].log())  # rank 0, on host 1, logs the steps
        wait_until(lambda: "step" in agents[0].log()[seen:], 30, "training to go on after the short freeze",
                   self.describe_all)
        for agent in agents:
            self.assertEqual(len(rounds_of(agent.log())), 1, f"a short freeze re-formed the job\n{agent.describe()}")
        # Frozen for far longer: hosts 2 and 3 move on; host 1, thawed, learns it and leaves.
        signal_host(1, signal.SIGSTOP)
        frozen_at = time.time()
        try:
            self.wait_for_training(agents[1], nodes=2)
        finally:
            signal_host(1, signal.SIGCONT)
        self.report_recovery("store host frozen", frozen_at)
        rc = agents[0].wait(60)
        self.assertEqual(rc, 4, agents[0].describe())
        self.assertRegex(agents[0].log(), rf"the job moved to the store at {re.escape(address(2))}:\d+ while this",
                         agents[0].describe())
        wait_until(lambda: not host_pids(1), 15, "host 1 to have no process left",
                   lambda: f"left on host 1: {host_pids(1)}")
        self.stop_training()
        self.assert_exit_zero(agents[1:])
        final = {self.assert_last_round(a, 2, 1) for a in agents[1:]}
        self.assertEqual(len(final), 1, self.describe_all())
        self.assert_results(2 * NPROC)


if __name__ == "__main__":
    unittest.main(verbosity=2)
