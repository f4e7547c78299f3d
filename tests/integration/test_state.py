"""Training state in the agents' memory (ddprun --state_memory, ddprun.state; docs/state.md), on one node.

Real gloo DDP workers (scripts/examples/ddp_train.py --state-every 10: parameters, optimizer and data generator
saved with ddprun.state, loaded at the start of every attempt), 2 ranks, torch 1.13 and 2.6:
  - a worker killed mid-run (async saves): every rank resumes at the same agreed step, and the job ends with
    parameters bit for bit those of a run that never stopped (params_sha256 of the same job without a failure);
  - a worker killed in the middle of its save: the agent removes the unfinished version, every rank resumes
    from the save before (the half-written one never loads), same parameters;
  - an async_ save of every kind of tensor (larger than a slice of the threaded staging copy, non-contiguous,
    conjugated, bool, bfloat16, int64, 0-d, empty) loads back exactly (tests/integration/state_roundtrip_worker.py).
With a light worker (no torch; the agent's logic): the python package reaches the workers (PYTHONPATH, the
directory, the quota); the directory is gone when the job ends and when the agent is SIGKILLed (the state
guard); too little room for --state_memory is said at start, naming the size and the directory.
The agents' copies to a buddy and a spare's restore: test_state_netns.py.
"""
import json
import os
import re
import signal
import unittest

from ddprun_testlib import PYTHON, REPO, IntegrationTestCase, read_pidfile, torch_subject, wait_until

TRAIN = os.path.join(REPO, "scripts", "examples", "ddp_train.py")
STEPS = 60  # saves after steps 9, 19, 29, 39, 49, 59 (--state-every 10)
JOB_WAIT = 300


@torch_subject
class StateTraining(IntegrationTestCase):
    """Real torch workers (integration.test_state, .torch26)."""

    reference = None  # params_sha256 of the uninterrupted job (one run per module)

    def train(self, out, *extra, agent_args=()):
        return ["--standalone", "--nproc_per_node", "2", "--max_restarts", "2", "--state_memory", "64M",
                *agent_args, "--python", PYTHON, TRAIN, "--steps", str(STEPS), "--hidden", "32", "--batch", "16",
                "--log-every", "20", "--state-every", "10", "--out", out, *extra]

    def results(self, agent, out):
        return self.job_results(agent, out, [0, 1], JOB_WAIT)

    def uninterrupted(self):
        if StateTraining.reference is None:
            out = self.path("reference")
            results = self.results(self.start(self.train(out)), out)
            self.assertEqual({r["start_step"] for r in results}, {0})
            StateTraining.reference = results[0]["params_sha256"]
        return StateTraining.reference

    def assert_resumed(self, agent, results, start_step):
        for r in results:
            self.assertEqual(r["attempt"], 1, agent.describe())
            self.assertEqual(r["start_step"], start_step, f"{results}\n{agent.describe()}")
        self.assertEqual({r["params_sha256"] for r in results}, {self.uninterrupted()},
                         f"parameters differ from the uninterrupted run's\n{agent.describe()}")
        self.assertIn(f"resumed from ddprun.state at step {start_step}", agent.stdout(), agent.describe())

    def test_a_killed_worker_resumes_every_rank_at_the_agreed_step(self):
        out = self.path("out")
        agent = self.start(self.train(out, "--state-async", "--fail-rank", "1", "--fail-step", "35",
                                      "--fail-until-attempt", "1"))
        # Rank 1 dies after step 35: the newest step both committed is 29.
        self.assert_resumed(agent, self.results(agent, out), 30)

    def test_a_worker_killed_while_saving_leaves_nothing_that_loads(self):
        out = self.path("out")
        agent = self.start(self.train(out, "--fail-rank", "1", "--crash-in-save-step", "29"))
        results = self.results(agent, out)
        self.assertIn("dying in the middle of a ddprun.state save", agent.stderr(), agent.describe())
        self.assertRegex(agent.stderr(), r"removed 1 unfinished version\(s\) of workers killed while saving: "
                                         r"\.rank1\.step29\.\d+\.tmp")
        # Rank 0 may have committed step 29; rank 1 has 19 at most: both resume after 19.
        self.assert_resumed(agent, results, 20)

    def test_an_async_save_copies_every_kind_of_tensor_exactly(self):
        # Three copy threads (this machine may have fewer CPUs: the split is the subject, not the speed).
        out = self.path("roundtrip.json")
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", "--max_restarts", "1",
                                    "--state_memory", "600M", "--python", PYTHON,
                                    os.path.join(REPO, "tests", "integration", "state_roundtrip_worker.py"), out],
                                   timeout=JOB_WAIT, env={"DDPRUN_STATE_COPY_THREADS": "3"})
        self.assertEqual(rc, 0, agent.describe())
        with open(out) as f:
            report = json.load(f)
        self.assertEqual(report, {"step": 7, "meta": True, "big": True, "mid0": True, "mid1": True, "mid2": True,
                                  "columns": True, "conj": True,
                                  "mask": True, "half": True, "ids": True, "scalar": True, "empty": True},
                         agent.describe())


class StateAgent(IntegrationTestCase):
    """The agent's logic, light workers (integration.test_state_agent)."""

    def test_the_workers_get_the_package_and_their_share(self):
        env_file = self.path("env.json")
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "2", "--state_memory", "10M",
                                    "--no_python", "--", "/usr/bin/python3", "-c",
                                    "import json, os, sys, ddprun.state; json.dump(dict(os.environ, "
                                    "MODULE=ddprun.state.__file__, ENABLED=ddprun.state.enabled()), "
                                    f"open('{env_file}' + os.environ['LOCAL_RANK'], 'w'), default=str)"],
                                   env={"DDPRUN_STATE_ROOT": self.path("shm")})
        self.assertEqual(rc, 0, agent.describe())
        for lr in (0, 1):
            with open(env_file + str(lr)) as f:
                env = json.load(f)
            self.assertTrue(env["DDPRUN_STATE_DIR"].startswith(self.path("shm", "ddprun-state-")), env)
            self.assertTrue(env["DDPRUN_STATE_DIR"].endswith("/own"), env)
            self.assertEqual(env["DDPRUN_STATE_QUOTA"], str((10 << 20) // 2 // 2))  # half of its share: its own three versions
            self.assertTrue(env["MODULE"].endswith("python_hooks/ddprun/state.py"), env)
            self.assertIs(env["ENABLED"], True)
        self.assertEqual(os.listdir(self.path("shm")), [], "the state directory outlived the job")

    def test_the_directory_goes_with_a_sigkilled_agent(self):
        root = self.path("shm")
        agent = self.start(["--standalone", "--nproc_per_node", "1", "--state_memory", "10M",
                            *self.fake("--pidfile", self.path("worker.pid"), "--hang")],
                           env={"DDPRUN_STATE_ROOT": root})
        self.wait_pidfiles(self.path("worker.pid"), 1)
        state_dir = os.path.join(root, f"ddprun-state-{agent.pid}")
        self.assertTrue(os.path.isdir(os.path.join(state_dir, "own")), agent.describe())
        with open(os.path.join(state_dir, "own", "rank0.step5.ddps"), "wb") as f:
            f.write(b"state the workers saved")
        agent.signal(signal.SIGKILL)
        agent.wait(30, drain=False)
        wait_until(lambda: not os.path.exists(state_dir), 30, f"{state_dir} to be removed by the state guard")
        self.assert_gone([read_pidfile(self.path("worker.pid"))], 30, "the worker")

    def test_no_room_for_the_state_is_said_at_start(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", "--state_memory", "1000000G",
                                    "--health_check_attempts", "1", *self.fake("--exit", "0")])
        self.assertEqual(rc, 8, agent.describe())
        self.assertRegex(agent.stderr(), r"--state_memory 1024000000 MiB of training state: /dev/shm has \d+ MiB "
                                         r"free, 1024000000 MiB needed", agent.describe())


if __name__ == "__main__":
    unittest.main(verbosity=2)
