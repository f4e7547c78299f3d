"""Hang detection under ddprun.

--hang_timeout: a 3-rank job in which rank 2 sleeps in stuck_in_data_loading() at step 10 while ranks 0 and 1
wait in their all-reduce. ddprun must notice that no rank makes progress, print where every rank is (rank 2 in
stuck_in_data_loading, the others together elsewhere), stop the group and restart it from its checkpoint - with
real gloo DDP workers (scripts/examples/ddp_train.py) and every torch version (1.13; 2.6 in the .torch26
variant); without restarts it exits 6 with every rank's stack in the summary and the logs, and a job that
computes normally is never stopped - with the light worker (light_train.py, the same options), once.
torch's FileTimer: TORCHELASTIC_ENABLE_FILE_TIMER=1 and torch's own FileTimerClient (tests/integration/
timer_worker.py), with every torch version: the rank that misses its deadline gets SIGKILL and the summary says
so."""
import json
import os
import re
import time
import unittest

from ddprun_testlib import PYTHON, REPO, IntegrationTestCase, torch_subject, training_worker

DDP_TRAIN = os.path.join(REPO, "scripts", "examples", "ddp_train.py")
TIMER_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timer_worker.py")
JOB_WAIT = 300  # seconds: three ranks import torch (seconds each on a 2-core machine), twice with a restart
HANG_TIMEOUT = 4  # seconds: a quarter of a rank's torch import on a busy machine would still count as progress


class HangDetection(IntegrationTestCase):
    def train(self, extra_ddprun, extra_script, nproc=3):
        """The test's training worker (self.worker: ddp_train.py or light_train.py) under ddprun."""
        python, script, env = training_worker(self.worker, DDP_TRAIN)
        args = (["--standalone", "--nproc_per_node", str(nproc), "--log_dir", self.path("logs"),
                 "--python", python] + extra_ddprun +
                [script, "--steps", "40", "--batch", "16", "--log-every", "10", "--out", self.path("out")] +
                extra_script)
        return self.run_agent(args, JOB_WAIT, env=env)

    def assert_where(self, stderr, agent):
        """The agent said where the ranks were: rank 2 alone in stuck_in_data_loading, ranks 0,1 together."""
        m = re.search(r"where the ranks are: (.*)", stderr)
        self.assertIsNotNone(m, agent.describe())
        where = m.group(1)
        script = re.escape(os.path.basename(training_worker(self.worker, DDP_TRAIN)[1]))
        self.assertRegex(where, rf"^rank 2: .*stuck_in_data_loading \({script}:\d+\)", agent.describe())
        self.assertRegex(where, r" · ranks 0,1: ", agent.describe())

    @torch_subject
    def test_a_hung_rank_is_named_and_the_group_restarts_from_its_checkpoint(self):
        agent, rc = self.train(["--hang_timeout", str(HANG_TIMEOUT), "--max_restarts", "1"],
                               ["--hang-rank", "2", "--hang-step", "10", "--checkpoint", self.path("ckpt.pt"),
                                "--save-every", "5"])
        self.assertEqual(rc, 0, agent.describe())
        stderr = agent.stderr()
        self.assertIn(f"no rank made progress for {HANG_TIMEOUT} s (--hang_timeout)", stderr, agent.describe())
        self.assert_where(stderr, agent)
        self.assertIn("restarting the worker group (1 of 1 restarts)", stderr, agent.describe())
        self.assertRegex(agent.stdout(), r"resumed from .* at step 10", agent.describe())
        for r in range(3):
            with open(self.path("out", f"rank{r}.json")) as f:
                result = json.load(f)
            self.assertEqual(result["attempt"], 1, result)
            self.assertTrue(result["identical"], result)

    def test_a_hung_job_without_restarts_exits_6_and_the_summary_shows_the_stacks(self):
        start = time.monotonic()
        agent, rc = self.train(["--hang_timeout", str(HANG_TIMEOUT)], ["--hang-rank", "2", "--hang-step", "10"])
        elapsed = time.monotonic() - start
        self.assertEqual(rc, 6, agent.describe())
        stderr = agent.stderr()
        self.assert_where(stderr, agent)
        summary = stderr[stderr.index("Root Cause (first observed failure):"):]
        self.assertIn("  rank      : 2 (local_rank: 2)", summary, agent.describe())
        self.assertRegex(summary, r"  exitcode  : 6 \(pid: \d+\)\n", agent.describe())
        self.assertIn(f"  message   : no progress from any rank for {HANG_TIMEOUT} s (--hang_timeout)", summary)
        self.assertRegex(summary, r"  stacks    :\n    rank 2: .*stuck_in_data_loading", agent.describe())
        # Each rank's log holds its full dump (every thread).
        logs = os.path.join(self.path("logs"))
        dumped = [d for d, _, files in os.walk(logs) if "stderr.log" in files and
                  "most recent call first" in open(os.path.join(d, "stderr.log")).read()]
        self.assertEqual(len(dumped), 3, dumped)
        print(f"hung job ended after {elapsed:.1f} s (hang_timeout {HANG_TIMEOUT} s)")

    def test_a_job_that_computes_is_never_taken_for_hung(self):
        agent, rc = self.train(["--hang_timeout", "3"], ["--steps", "150"])
        self.assertEqual(rc, 0, agent.describe())
        self.assertNotIn("no rank made progress", agent.stderr(), agent.describe())

    @torch_subject
    def test_torch_file_timer_kills_the_rank_that_misses_its_deadline(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "2", "--log_dir", self.path("logs"),
                                    "--python", PYTHON, TIMER_WORKER, "1"], JOB_WAIT,
                                   env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1"})
        self.assertEqual(rc, 128 + 9, agent.describe())
        stderr = agent.stderr()
        self.assertIn("serving torch's FileTimer at", stderr, agent.describe())
        self.assertIn("rank 1 missed its deadline (scope load_batch)", stderr, agent.describe())
        self.assertIn("rank 0: quick step done", agent.stdout(), agent.describe())
        summary = stderr[stderr.index("Root Cause (first observed failure):"):]
        self.assertIn("  rank      : 1 (local_rank: 1)", summary, agent.describe())
        self.assertIn("  message   : rank 1 missed its deadline (scope load_batch)", summary, agent.describe())
        self.assertRegex(summary, r"rank 1: .*slow_data_loading \(timer_worker\.py:\d+\)", agent.describe())


if __name__ == "__main__":
    unittest.main()
