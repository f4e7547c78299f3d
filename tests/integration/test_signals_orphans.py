"""Signals to ddprun and what happens to its workers: forwarding, exit codes, the SIGKILL after
--shutdown_timeout, process groups, and no orphans when the agent itself is SIGKILLed. Fake workers only."""
import re
import signal
import unittest

from ddprun_testlib import IntegrationTestCase, proc_stat, wait_until

WAIT = 60  # seconds: bound for anything that should take well under a second


class Signals(IntegrationTestCase):
    def start_recording_workers(self, nproc, extra_args=()):
        """nproc workers that record the signals they get and hang; returns (agent, worker pids)."""
        agent = self.start(["--standalone", "--nproc_per_node", str(nproc), *extra_args,
                            *self.fake("--record-signals", self.path("signals_${local_rank}"),
                                       "--pidfile", self.path("pid_${local_rank}"), "--hang")])
        return agent, self.wait_pidfiles(self.path("pid_{}"), nproc, WAIT)

    def recorded(self, nproc):
        out = []
        for lr in range(nproc):
            with open(self.path(f"signals_{lr}")) as f:
                out.append(f.read().split())
        return out

    def check_forwarded(self, sig, extra_args=()):
        agent, pids = self.start_recording_workers(3, extra_args)
        agent.signal(sig)
        self.assertEqual(agent.wait(WAIT), 128 + sig, agent.describe())
        name = signal.Signals(sig).name[3:]
        self.assertEqual(self.recorded(3), [["ready", name]] * 3, agent.describe())
        self.assert_gone(pids, WAIT, "workers after ddprun exited")

    def test_sigterm_is_forwarded_and_exits_143(self):
        self.check_forwarded(signal.SIGTERM)

    def test_sigint_is_forwarded_and_exits_130(self):
        self.check_forwarded(signal.SIGINT)

    def test_sigusr1_is_forwarded_when_handled(self):
        self.check_forwarded(signal.SIGUSR1, ["--signals_to_handle", "SIGTERM,SIGUSR1"])

    def test_worker_ignoring_sigterm_is_killed_after_shutdown_timeout(self):
        agent = self.start(["--standalone", "--nproc_per_node", "2", "--shutdown_timeout", "1",
                            *self.fake("--ignore-sigterm", "--pidfile", self.path("pid_${local_rank}"), "--hang")])
        pids = self.wait_pidfiles(self.path("pid_{}"), 2, WAIT)
        agent.signal(signal.SIGTERM)
        # The default grace is 30 s; ddprun must use the 1 s given (the bound leaves room for a slow machine).
        self.assertEqual(agent.wait(20), 143, agent.describe())
        self.assert_gone(pids, WAIT, "workers that ignored SIGTERM")

    def test_each_worker_leads_its_own_process_group(self):
        agent, pids = self.start_recording_workers(3)
        agent_pgrp = proc_stat(agent.pid)[2]
        for pid in pids:
            st = proc_stat(pid)
            self.assertIsNotNone(st, f"worker {pid} vanished")
            self.assertEqual(st[2], pid, f"worker {pid}: pgid {st[2]}")
            self.assertNotEqual(st[2], agent_pgrp)
        agent.signal(signal.SIGTERM)
        self.assertEqual(agent.wait(WAIT), 143, agent.describe())


class Orphans(IntegrationTestCase):
    def start_with_grandchildren(self, nproc):
        """Workers that each fork a grandchild ignoring TERM/INT/HUP; returns (agent, workers, grandchildren)."""
        agent = self.start(["--standalone", "--nproc_per_node", str(nproc),
                            *self.fake("--spawn-grandchild", "--pidfile", self.path("pid_${local_rank}"), "--hang")])
        workers = self.wait_pidfiles(self.path("pid_{}"), nproc, WAIT)

        def announced():
            pids = [int(p) for p in re.findall(r"^grandchild (\d+)$", agent.stdout(), re.M)]
            return pids if len(pids) == nproc else None

        return agent, workers, wait_until(announced, WAIT, "grandchild pids on ddprun's stdout")

    def test_sigkilled_agent_leaves_no_worker(self):
        self.allow_leftovers = True  # the assertion below reports survivors itself
        agent, workers, _ = self.start_with_grandchildren(2)
        agent.signal(signal.SIGKILL)
        self.assertEqual(agent.wait(WAIT, drain=False), -signal.SIGKILL)
        self.assert_gone(workers, 10, "workers of a SIGKILLed ddprun")

    # PR_SET_PDEATHSIG kills the workers, but a grandchild (re-parented to init, ignoring SIGTERM) would have
    # nobody left to kill it once the agent is SIGKILLed: ddprun's orphan guard process (agent/orphan_guard.h)
    # SIGKILLs the workers' groups when the agent vanishes. torchrun leaves such grandchildren running.
    def test_sigkilled_agent_leaves_no_grandchild(self):
        agent, workers, grandchildren = self.start_with_grandchildren(2)
        agent.signal(signal.SIGKILL)
        self.assertEqual(agent.wait(WAIT, drain=False), -signal.SIGKILL)
        self.assert_gone(workers + grandchildren, 10, "workers and grandchildren of a SIGKILLed ddprun")

    def test_sigterm_also_ends_grandchildren(self):
        agent, workers, grandchildren = self.start_with_grandchildren(2)
        agent.signal(signal.SIGTERM)
        self.assertEqual(agent.wait(WAIT), 143, agent.describe())
        # The worker dies of SIGTERM; its grandchild ignores it and must be SIGKILLed with the group.
        self.assert_gone(workers + grandchildren, 10, "workers and grandchildren after SIGTERM")

    def test_failed_worker_takes_its_grandchild_along(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1",
                                    *self.fake("--spawn-grandchild", "--exit", "9")], WAIT)
        self.assertEqual(rc, 9, agent.describe())
        grandchildren = [int(p) for p in re.findall(r"^grandchild (\d+)$", agent.stdout(), re.M)]
        self.assertEqual(len(grandchildren), 1, agent.describe())
        self.assert_gone(grandchildren, 10, "grandchild of a failed worker")


if __name__ == "__main__":
    unittest.main()
