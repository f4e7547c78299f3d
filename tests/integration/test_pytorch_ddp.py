"""Real PyTorch DDP (gloo, CPU) under ddprun: scripts/examples/ddp_train.py on one node and on two agents over
loopback, with a coordinated restart across nodes and a failure without restarts. Slow: every worker imports
torch (seconds each on a small machine), so the jobs are kept short."""
import glob
import json
import os
import unittest

from ddprun_testlib import PYTHON, REPO, IntegrationTestCase, free_port, torch_subject

TRAIN = os.path.join(REPO, "scripts", "examples", "ddp_train.py")
JOB_WAIT = 150  # seconds for one short job (torch imports dominate)


@torch_subject
class PyTorchDDP(IntegrationTestCase):
    def results(self, out_dir):
        files = sorted(glob.glob(os.path.join(out_dir, "rank*.json")))
        out = []
        for path in files:
            with open(path) as f:
                out.append(json.load(f))
        return sorted(out, key=lambda r: r["rank"])

    def check_results(self, results, world_size, attempt):
        self.assertEqual([r["rank"] for r in results], list(range(world_size)))
        for r in results:
            self.assertEqual(r["world_size"], world_size)
            self.assertTrue(r["identical"])
            self.assertEqual(r["attempt"], attempt)
        self.assertEqual(len({r["checksum"] for r in results}), 1, [r["checksum"] for r in results])

    def start_two_nodes(self, script_args, extra=()):
        """Two agents (--nnodes 2, 2 workers each) sharing a store on 127.0.0.1; returns [agent0, agent1]."""
        port = free_port()
        return [self.start(["--nnodes", "2", "--node_rank", str(node), "--master_addr", "127.0.0.1",
                            "--master_port", str(port), "--nproc_per_node", "2", "--rdzv_id", "two-nodes",
                            *extra, "--python", PYTHON, TRAIN, *script_args])
                for node in range(2)]

    def wait_all(self, agents):
        return [a.wait(JOB_WAIT) for a in agents]

    def describe(self, agents):
        return "\n".join(a.describe() for a in agents)

    def test_standalone_four_workers(self):
        out = self.path("out")
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "4", "--python", PYTHON, TRAIN,
                                    "--steps", "40", "--out", out], JOB_WAIT)
        self.assertEqual(rc, 0, agent.describe())
        self.check_results(self.results(out), world_size=4, attempt=0)

    def test_two_agents_train_together(self):
        out = self.path("out")
        agents = self.start_two_nodes(["--steps", "20", "--out", out])
        self.assertEqual(self.wait_all(agents), [0, 0], self.describe(agents))
        results = self.results(out)
        self.check_results(results, world_size=4, attempt=0)
        self.assertEqual([r["group_rank"] for r in results], [0, 0, 1, 1])
        self.assertEqual([r["local_rank"] for r in results], [0, 1, 0, 1])

    def test_failure_on_one_node_restarts_both(self):
        out = self.path("out")
        agents = self.start_two_nodes(["--steps", "20", "--out", out, "--fail-rank", "3", "--fail-step", "10"],
                                      ["--max_restarts", "1"])
        self.assertEqual(self.wait_all(agents), [0, 0], self.describe(agents))
        self.check_results(self.results(out), world_size=4, attempt=1)
        self.assertEqual(self.live_processes(), [])

    def test_failure_without_restarts_fails_both_nodes(self):
        out = self.path("out")
        agents = self.start_two_nodes(["--steps", "20", "--out", out, "--fail-rank", "3", "--fail-step", "10"])
        self.assertEqual(self.wait_all(agents), [13, 13], self.describe(agents))
        self.assertEqual(self.results(out), [])
        self.assertEqual(self.live_processes(), [])


if __name__ == "__main__":
    unittest.main()
