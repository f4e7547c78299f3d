"""The C++ worker API of the training state (ddprun::sdk::state, docs/state.md "The C++ API") under ddprun
--state_memory, through the SDK's example trainer (worker_sdk/examples/train_mlp.cc --state-every 10: the model's
parameters and the SGD optimizer's state saved asynchronously, loaded at the start of every attempt), 2 ranks on
one node; the trainer is C++ (no torch import), so these runs are cheap:
  - a worker killed mid-run: every rank resumes at the same agreed step (each rank logs it), and the job ends
    with parameters bit for bit those of a run that never stopped (the params_fnv1a of rank 0's "done:" line);
  - a worker killed in the middle of its save (SIGXFSZ past a lowered file size limit): the agent removes the
    unfinished version, every rank resumes from the save before, same parameters;
  - a version that does not fit the rank's share of --state_memory: the worker's error names the size to give;
  - Python's ddprun.state.load() reads a version the C++ writer wrote (a dict name -> tensor).
$EXAMPLE_TRAIN names the trainer (tests/integration/CMakeLists.txt registers this module only with libtorch).
The copies to a buddy treat a version as bytes plus its manifest whoever wrote it: test_state_netns.py.
"""
import os
import re
import subprocess
import unittest

from ddprun_testlib import PYTHON, REPO, IntegrationTestCase

EXAMPLE = os.environ.get("EXAMPLE_TRAIN", "")
STEPS = 60  # saves after the steps of index 9, 19, 29, 39, 49, 59 (--state-every 10)
JOB_WAIT = 240
RESUMED = re.compile(r"rank (\d): resumed from ddprun::sdk::state at step (\d+) \(restart 1\)")
FNV = re.compile(r"^done: 2 ranks, .* params_fnv1a=([0-9a-f]{16})$", re.M)


@unittest.skipUnless(EXAMPLE, "EXAMPLE_TRAIN must name ddprun-example-train")
class StateSdk(IntegrationTestCase):
    reference = None  # params_fnv1a of the uninterrupted job (one run per module)

    def train(self, *extra, state_memory="64M", hidden="64"):
        return ["--standalone", "--nproc_per_node", "2", "--max_restarts", "1", "--state_memory", state_memory,
                "--no_python", EXAMPLE, "--threads", "1", "--steps", str(STEPS), "--hidden", hidden,
                "--log-every", "0", "--state-every", "10", *extra]

    def run_job(self, *extra):
        agent = self.start(self.train(*extra), env={"DDPRUN_STATE_ROOT": self.path("shm")})
        rc = agent.wait(JOB_WAIT)
        self.assertEqual(rc, 0, agent.describe())
        fnv = FNV.findall(agent.stdout())
        self.assertEqual(len(fnv), 1, agent.describe())
        return agent, fnv[0]

    def uninterrupted(self):
        if StateSdk.reference is None:
            agent, StateSdk.reference = self.run_job()
            self.assertNotIn("resumed from", agent.stdout(), agent.describe())
        return StateSdk.reference

    def assert_resumed(self, agent, fnv, steps):
        resumed = {int(rank): int(step) for rank, step in RESUMED.findall(agent.stdout())}
        self.assertEqual(sorted(resumed), [0, 1], agent.describe())
        self.assertEqual(len(set(resumed.values())), 1, f"the ranks resumed at different steps\n{agent.describe()}")
        self.assertIn(resumed[0], steps, agent.describe())
        self.assertEqual(fnv, self.uninterrupted(), f"parameters differ from the uninterrupted run's\n"
                                                    f"{agent.describe()}")

    def test_a_killed_worker_resumes_every_rank_at_the_agreed_step(self):
        agent, fnv = self.run_job("--crash-at-step", "35", "--crash-rank", "1")
        self.assertIn("rank 1: crashing on purpose at step 35", agent.stderr(), agent.describe())
        # Rank 1 dies before step 35: both committed step 29 (async: its write had 5 steps' time; were it
        # still unfinished, both would take 19 and resume at 20, together).
        self.assert_resumed(agent, fnv, (30, 20))

    def test_a_worker_killed_while_saving_leaves_nothing_that_loads(self):
        agent, fnv = self.run_job("--crash-in-save-step", "29", "--crash-rank", "1")
        self.assertIn("dying in the middle of a ddprun::sdk::state save of step 29", agent.stderr(),
                      agent.describe())
        self.assertRegex(agent.stderr(), r"removed 1 unfinished version\(s\) of workers killed while saving: "
                                         r"\.rank1\.step29\.\d+\.tmp")
        # Rank 0 may have committed step 29; rank 1's save of 29 waited for its 19 and died: both take 19.
        self.assert_resumed(agent, fnv, (20,))

    def test_no_room_is_a_clear_error(self):
        # 1 MiB for 2 local ranks: 256 KiB for each rank's own versions; one version of a model 256 wide takes
        # about 0.6 MiB.
        agent = self.start(self.train(state_memory="1M", hidden="256"),
                           env={"DDPRUN_STATE_ROOT": self.path("shm")})
        rc = agent.wait(JOB_WAIT)
        self.assertNotEqual(rc, 0, agent.describe())
        self.assertRegex(agent.stderr(), r"ddprun-example-train: ddprun::sdk::state::save\(step=9\): rank \d's "
                                         r"version takes 0\.\d MiB .* each of this node's 2 local ranks 0\.\d MiB .*"
                                         r"Start ddprun with --state_memory \dM or more", agent.describe())

    def test_python_reads_a_version_of_the_cpp_writer(self):
        directory = self.path("state")
        os.makedirs(directory)
        env = dict(os.environ, DDPRUN_STATE_DIR=directory)
        for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
            env.pop(name, None)
        out = subprocess.run([EXAMPLE, "--threads", "1", "--steps", "10", "--hidden", "64", "--state-every", "5",
                              "--log-every", "0"], env=env, capture_output=True, text=True, timeout=JOB_WAIT)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        script = ("import torch.distributed as dist, ddprun.state as s\n"
                  "step, state = s.load(store=dist.HashStore())\n"
                  "print(step, sorted((k, tuple(v.shape), str(v.dtype)) for k, v in state.items()))\n")
        env["PYTHONPATH"] = os.path.join(REPO, "agent", "state", "python")
        out = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=JOB_WAIT)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertEqual(out.stdout.strip(),
                         "9 [('model.0.bias', (64,), 'torch.float32'), ('model.0.weight', (64, 32), 'torch.float32'), "
                         "('model.2.bias', (64,), 'torch.float32'), ('model.2.weight', (64, 64), 'torch.float32'), "
                         "('model.4.bias', (1,), 'torch.float32'), ('model.4.weight', (1, 64), 'torch.float32'), "
                         f"('optimizer', {self.optimizer_shape(out.stdout)}, 'torch.uint8')]")

    @staticmethod
    def optimizer_shape(text):
        m = re.search(r"\('optimizer', (\(\d+,\))", text)
        return m.group(1) if m else "?"


if __name__ == "__main__":
    unittest.main(verbosity=2)
