"""The example trainer (worker_sdk/examples/train_mlp.cc) as a user runs it: under ddprun with 2 ranks, as a
plain process, and with one rank crashing once — resumed from the checkpoint after the agent's restart.
Needs $DDPRUN and $EXAMPLE_TRAIN (set by CTest). Every process runs in its own session and is killed with its
group on a timeout."""
import os
import signal
import subprocess
import tempfile
import unittest

DDPRUN = os.environ.get("DDPRUN", "")
EXAMPLE = os.environ.get("EXAMPLE_TRAIN", "")
TIMEOUT = 240


def run(cmd):
    """Runs cmd; returns (exit code, stdout + stderr)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"timed out after {TIMEOUT} s: {' '.join(cmd)}\n{out}")
    return p.returncode, out


@unittest.skipUnless(DDPRUN and EXAMPLE, "DDPRUN and EXAMPLE_TRAIN must name the binaries")
class ExampleTrain(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ddprun-example-")
        self.addCleanup(self.tmp.cleanup)

    def ddprun(self, *args, example_args=()):
        return run([DDPRUN, "--standalone", "--nproc_per_node", "2", *args, "--no_python", EXAMPLE,
                    "--threads", "1", *example_args])

    def test_two_ranks(self):
        rc, out = self.ddprun(example_args=["--steps", "20", "--log-every", "10"])
        self.assertEqual(rc, 0, out)
        self.assertIn("training: 2 ranks", out)
        self.assertIn("parameters identical", out)
        self.assertIn("summary: ranks=2", out)

    def test_single_process(self):
        rc, out = run([EXAMPLE, "--steps", "5", "--threads", "1", "--accumulation", "2"])
        self.assertEqual(rc, 0, out)
        self.assertIn("done: 1 ranks", out)

    def test_crash_resumes_from_checkpoint(self):
        ckpt = os.path.join(self.tmp.name, "ckpt.pt")
        rc, out = self.ddprun("--max_restarts", "1", example_args=[
            "--steps", "30", "--checkpoint", ckpt, "--checkpoint-every", "10", "--crash-at-step", "15",
            "--log-every", "5"])
        self.assertEqual(rc, 0, out)
        self.assertIn("rank 1: crashing on purpose at step 15", out)
        self.assertIn(f"resumed from {ckpt} at step 10 (restart 1)", out)
        self.assertIn("step 30/30", out)
        self.assertIn("parameters identical", out)

    def test_crash_without_restarts_fails(self):
        rc, out = self.ddprun(example_args=["--steps", "10", "--crash-at-step", "3", "--log-every", "0"])
        self.assertNotEqual(rc, 0, out)
        self.assertIn("crashing on purpose", out)


if __name__ == "__main__":
    unittest.main()
