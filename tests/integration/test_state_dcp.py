"""torch.distributed.checkpoint on ddprun.state (ddprun.state.StorageWriter/StorageReader; docs/state.md,
"torch.distributed.checkpoint").

StateDCP (integration.test_state_dcp.torch26 only: the storage interface is torch 2's; CMake's TORCH26_ONLY
registers no torch 1.13 variant), real gloo DDP workers of torch 2.6 (tests/integration/dcp_train.py: a small MLP
and Adam, dcp.save with StorageWriter every 4 steps, dcp.load with StorageReader after reader.agree()), 2 ranks:
  - an uninterrupted job: on its first start reader.agree() is None on every rank with the reason, and dcp.load()
    without agree() raises on every rank with the reason on stderr; each rank's version holds every tensor of the
    state outside the pickle (its own copy of the replicated items the planner gave to the other rank);
  - a worker killed after step 9: every rank loads step 7 (the newest both committed) and ends with parameters and
    optimizer state bit for bit those of the uninterrupted job.
OnHostTorch (integration.test_state_dcp_host): `import ddprun.state` imports no torch, and with torch 1.x
constructing a StorageWriter or StorageReader raises StateError naming the torch version needed.
"""
import json
import os
import subprocess

from ddprun_testlib import EXPECTED_TORCH, HOST_PYTHON, PYTHON, REPO, IntegrationTestCase, torch_subject

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "dcp_train.py")
JOB_WAIT = 300
STATE_TENSORS = 4 + 3 * 4  # the MLP's weights and biases; Adam's step, exp_avg and exp_avg_sq of each


@torch_subject
class StateDCP(IntegrationTestCase):
    """Real torch 2 workers (integration.test_state_dcp.torch26)."""

    reference = None  # the uninterrupted job's results (one run per module)

    def setUp(self):
        super().setUp()
        self.assertTrue(EXPECTED_TORCH and not EXPECTED_TORCH.startswith("1."),
                        "test_state_dcp's StateDCP runs only in the .torch26 variant (ctest -R test_state_dcp)")

    def train(self, out, *extra):
        return ["--standalone", "--nproc_per_node", "2", "--max_restarts", "1", "--state_memory", "64M",
                "--python", PYTHON, TRAIN, "--steps", "12", "--every", "4", "--out", out, *extra]

    def results(self, agent, out):
        return self.job_results(agent, out, [0, 1], JOB_WAIT)

    def uninterrupted(self):
        if StateDCP.reference is None:
            out = self.path("reference")
            agent = self.start(self.train(out, "--load-before-agree"))
            results = self.results(agent, out)
            for r in results:
                self.assertEqual((r["attempt"], r["start_step"]), (0, 0), agent.describe())
                self.assertEqual(r["state_tensors"], STATE_TENSORS, r)
                self.assertEqual(r["saved"], [11, STATE_TENSORS], f"{r}: the tensors went into the pickle")
                rank = r["rank"]
                self.assertRegex(agent.stdout(), rf"rank {rank}: nothing to resume from \(rank \d has no version on "
                                                 r"this node\): the disk checkpoint applies")
                self.assertRegex(agent.stdout(), rf"rank {rank}: dcp.load\(\) without agree\(\) raised "
                                                 r"(CheckpointException|TypeError)")
                self.assertRegex(agent.stderr(), rf"\[rank {rank}\] ddprun.state.StorageReader: nothing to load: "
                                                 r"rank \d has no version on this node \(call reader.agree\(\)")
            self.assertEqual(len({(r["params_sha256"], r["optim_sha256"]) for r in results}), 1, results)
            StateDCP.reference = results[0]
        return StateDCP.reference

    def test_a_killed_worker_resumes_every_rank_at_the_agreed_step(self):
        reference = self.uninterrupted()
        out = self.path("out")
        agent = self.start(self.train(out, "--fail-rank", "1", "--fail-step", "9"))
        results = self.results(agent, out)
        self.assertIn("rank 1: crashing after step 9", agent.stderr(), agent.describe())
        for r in results:
            # Rank 1 died after step 9: the newest step both committed is 7.
            self.assertEqual((r["attempt"], r["start_step"]), (1, 8), f"{results}\n{agent.describe()}")
            self.assertIn(f"rank {r['rank']}: resumed from ddprun.state at step 8", agent.stdout(), agent.describe())
            self.assertEqual((r["params_sha256"], r["optim_sha256"]),
                             (reference["params_sha256"], reference["optim_sha256"]),
                             f"the parameters or the optimizer state differ from the uninterrupted run's\n"
                             f"{agent.describe()}")


class OnHostTorch(IntegrationTestCase):
    """The host's interpreter (integration.test_state_dcp_host): no job, no ddprun."""

    def test_import_is_cheap_and_torch_1_is_told_what_it_needs(self):
        probe = ("import json, sys, ddprun.state\n"
                 "out = {'torch_imported': 'torch' in sys.modules}\n"
                 "import torch\n"
                 "out['torch'] = torch.__version__\n"
                 "for cls in ('StorageWriter', 'StorageReader'):\n"
                 "    try:\n"
                 "        getattr(ddprun.state, cls)(5) if cls == 'StorageWriter' else getattr(ddprun.state, cls)()\n"
                 "        out[cls] = 'constructed'\n"
                 "    except ddprun.state.StateError as e:\n"
                 "        out[cls] = str(e)\n"
                 "print(json.dumps(out))\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "agent", "state", "python"))
        done = subprocess.run([HOST_PYTHON, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        out = json.loads(done.stdout.splitlines()[-1])
        self.assertIs(out["torch_imported"], False, "import ddprun.state imported torch")
        for cls in ("StorageWriter", "StorageReader"):
            if out["torch"].startswith("1."):
                self.assertEqual(out[cls], f"ddprun.state.{cls} needs torch 2.0 or newer with torch.distributed "
                                           "(tested with 2.6): torch.distributed.checkpoint's storage interface is "
                                           f"torch 2's, and this worker's torch is {out['torch']}. Use "
                                           "ddprun.state.save()/load() instead (docs/state.md)")
            else:
                self.assertEqual(out[cls], "constructed", out)


if __name__ == "__main__":
    import unittest

    unittest.main(verbosity=2)
