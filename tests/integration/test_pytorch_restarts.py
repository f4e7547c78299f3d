"""Restarts that recover: a real PyTorch DDP (gloo) job whose rank 0 crashes (os._exit, mid-training) in
each of RESTARTS attempts in a row (4, or DDPRUN_IT_RESTARTS for a soak), under ddprun --max_restarts
RESTARTS. Every new worker group must initialise and train again: since torch 2.4 workers no longer prefix their keys per attempt (they expect a fresh store per
retry), so a restarted group that could see the previous attempt's keys hangs in gloo's connectFullMesh or
passes a stale barrier. ddprun gives every attempt a clean keyspace (docs/rendezvous.md). Runs with torch
1.13 and torch 2.6 workers (integration.test_pytorch_restarts[.torch26])."""
import glob
import json
import os
import re
import time
import unittest

from ddprun_testlib import PYTHON, REPO, IntegrationTestCase, free_port, torch_subject

TRAIN = os.path.join(REPO, "scripts", "examples", "ddp_train.py")
PRESTART_WORKER = os.path.join(REPO, "tests", "integration", "prestart_worker.py")
# A restart that sees its predecessor's keys fails at once (the first restart; a stale barrier or a gloo
# connectFullMesh hang), so a few restarts in a row prove the clean keyspace: 4 in CI (2 across two agents).
# DDPRUN_IT_RESTARTS=50 soaks both cases (about 2 s per restart with torch 1.13, 6 s with 2.6 on 2 cores).
SOAK = os.environ.get("DDPRUN_IT_RESTARTS")
RESTARTS = int(SOAK or "4")
RESTARTS_TWO_NODES = int(SOAK or "2")  # the same path across two agents (static rendezvous)
# A stuck attempt fails gloo's 60 s timeout and burns a restart, so a hang cannot pass unnoticed: the job
# would run out of restarts (exit 3) or out of this bound.
JOB_WAIT = 840


@torch_subject
class PyTorchRestarts(IntegrationTestCase):
    def check(self, agents, out, world, restarts=RESTARTS):
        start = time.monotonic()
        rcs = [a.wait(JOB_WAIT) for a in agents]
        took = time.monotonic() - start
        described = "\n".join(a.describe() for a in agents)
        self.assertEqual(rcs, [0] * len(agents), described)
        results = []
        for path in sorted(glob.glob(os.path.join(out, "rank*.json"))):
            with open(path) as f:
                results.append(json.load(f))
        self.assertEqual(sorted(r["rank"] for r in results), list(range(world)), described)
        for r in results:
            self.assertEqual(r["attempt"], restarts)
            self.assertTrue(r["identical"])
        # Each attempt crashed exactly once (rank 0 at step 3) and was restarted: no attempt hung or failed in
        # some other way (a hang would show as a gloo timeout, a different exit code, or a missing restart).
        log = agents[0].output()
        crashes = re.findall(r"(?m)^(?:\[[^]]*\]:)?rank 0: crashing at step 3 \(attempt (\d+)\)", log)
        self.assertEqual([int(a) for a in crashes], list(range(restarts)), described)
        done = re.findall(r"restarting the worker group \((\d+) of %d restarts\)" % restarts, log)
        self.assertEqual([int(n) for n in done], list(range(1, restarts + 1)), described)
        self.assertNotIn("Timed out", log)
        self.assertEqual(self.live_processes(), [])
        print(f"{restarts} restarts with {PYTHON}: {took:.1f} s in all, {took / (restarts + 1):.2f} s per attempt")

    def test_restarts_in_a_row_standalone(self):
        out = self.path("out")
        agents = [self.start(["--standalone", "--nproc_per_node", "2", *job_args(out)])]
        self.check(agents, out, world=2)

    def test_restarts_in_a_row_two_nodes(self):
        out = self.path("out")
        port = free_port()
        agents = [self.start(["--nnodes", "2", "--node_rank", str(node), "--master_addr", "127.0.0.1",
                              "--master_port", str(port), "--nproc_per_node", "1", "--rdzv_id", "restarts",
                              *job_args(out, RESTARTS_TWO_NODES)])
                  for node in range(2)]
        self.check(agents, out, world=2, restarts=RESTARTS_TWO_NODES)

    def test_prestart(self):
        """--prestart: every attempt runs in a standby started ahead (torch already imported) — the first in one
        started while the agent waited in the rendezvous, attempts 1 and 2 in ones started during the attempt
        before — with the attempt's argv, environment and log files; nothing is left behind at the end."""
        out = self.path("out")
        os.makedirs(out)
        logs = self.path("logs")
        agent = self.start(["--standalone", "--nproc_per_node", "2", "--max_restarts", "2", "--prestart",
                            "--prestart_delay", "0", "--log_dir", logs, "--tee", "3", "--python", PYTHON,
                            PRESTART_WORKER, out, "2"])
        self.assertEqual(agent.wait(JOB_WAIT), 0, agent.describe())
        records = {}
        for path in glob.glob(os.path.join(out, "*.json")):
            with open(path) as f:
                r = json.load(f)
            records[(r["attempt"], r["rank"])] = r
        self.assertEqual(sorted(records), [(a, r) for a in range(3) for r in range(2)], agent.describe())
        for (attempt, rank), r in records.items():
            self.assertTrue(r["preloaded"], (attempt, rank))
            self.assertEqual(r["argv"], [PRESTART_WORKER, out, "2"])
            self.assertEqual((r["name"], r["path0"]), ("__main__", os.path.dirname(PRESTART_WORKER)))
            self.assertEqual((r["world"], r["env_rank"], r["grad_ok"]), (2, str(rank), True))
        # Each attempt's output went to that attempt's log files, as from a fresh worker.
        for attempt in range(3):
            for rank in range(2):
                logged = glob.glob(os.path.join(logs, "*", f"attempt_{attempt}", str(rank), "stdout.log"))
                self.assertEqual(len(logged), 1)
                with open(logged[0]) as f:
                    self.assertEqual(f.read(), f"rank {rank} attempt {attempt} trained\n")
        self.assertEqual(self.live_processes(), [])


def job_args(out, restarts=RESTARTS):
    return ["--max_restarts", str(restarts), "--python", PYTHON, TRAIN, "--steps", "6", "--hidden", "16",
            "--batch", "8", "--log-every", "1000", "--out", out, "--fail-rank", "0", "--fail-step", "3",
            "--fail-until-attempt", str(restarts)]


if __name__ == "__main__":
    unittest.main()
