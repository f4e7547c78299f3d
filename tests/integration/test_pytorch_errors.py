"""Torch's @record error files under ddprun, written by the workers' own torch (1.13; 2.6 in the .torch26
variant): the failure summary shows the exception message and traceback read from the error file and names
the file; a worker the agent stopped is not listed; with two failing ranks the root cause is the one whose
error file is older, even when the other one exited first. Workers: tests/integration/record_worker.py."""
import glob
import json
import os
import re
import time
import unittest

from ddprun_testlib import EXPECTED_TORCH, PYTHON, IntegrationTestCase

RECORD_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "record_worker.py")
JOB_WAIT = 150  # seconds for one short job (every worker imports torch: seconds each on a small machine)
FIELD = re.compile(r"^  (\w+)\s*: ?(.*)$")


def parse_failure(block):
    """The fields of one failure of the summary ("  rank      : 1 (local_rank: 1)", ...) as a dict; the
    traceback's indented lines joined under "traceback"."""
    fields = {}
    tb = []
    in_tb = False
    for line in block.splitlines():
        if in_tb and line.startswith("    "):
            tb.append(line[4:])
            continue
        m = FIELD.match(line)
        if m:
            fields[m.group(1)] = m.group(2)
            in_tb = m.group(1) == "traceback"
    fields["traceback"] = "\n".join(tb) if tb else fields.get("traceback", "")
    return fields


def parse_summary(stderr):
    """(root cause, [other failures]) of ddprun's failure summary on stderr, each a parse_failure dict."""
    start = stderr.index("Failures:\n")
    root_at = stderr.index("Root Cause (first observed failure):\n[0]:\n", start)
    end = stderr.index("=" * 72, root_at)
    # "[1]:\n<fields>[2]:\n<fields>", or "  <NO_OTHER_FAILURES>" alone.
    others = re.split(r"^\[\d+\]:\n", stderr[start + len("Failures:\n"):root_at], flags=re.M)[1:]
    others = [parse_failure(b) for b in others]
    root = parse_failure(stderr[root_at:end].split("[0]:\n", 1)[1])
    return root, others


class RecordErrorFiles(IntegrationTestCase):
    def run_job(self, fail, nproc=2):
        """Runs record_worker.py on `nproc` local ranks with these failure modes; returns (agent, exit code)."""
        out = self.path("out")
        os.makedirs(out)
        spec = json.dumps({"out": out, "fail": {str(lr): mode for lr, mode in fail.items()}})
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", str(nproc), "--log_dir", self.path("logs"),
                                    "--python", PYTHON, RECORD_WORKER, spec], JOB_WAIT)
        for lr in range(nproc):
            with open(os.path.join(out, f"torch-{lr}.txt")) as f:
                version = f.read()
            if EXPECTED_TORCH:
                self.assertTrue(version.startswith(EXPECTED_TORCH + "."),
                                f"the workers' interpreter {PYTHON} imports torch {version}, not {EXPECTED_TORCH}")
        return agent, rc

    def error_file(self, local_rank):
        paths = glob.glob(self.path("logs", "*", "attempt_0", str(local_rank), "error.json"))
        self.assertEqual(len(paths), 1, paths)
        with open(paths[0]) as f:
            return paths[0], json.load(f)

    def assert_shows_error_file(self, failure, local_rank, agent):
        """`failure` (from the summary) shows local rank `local_rank`'s error file: path, message, traceback."""
        path, content = self.error_file(local_rank)
        message = f"ValueError: record_worker rank {local_rank} failed on purpose"
        # torch's @record layout (1.13 and 2.6 alike): the agent reads it, so the test pins it.
        self.assertEqual(content["message"]["message"], message, content)
        self.assertRegex(content["message"]["extraInfo"]["timestamp"], r"^\d+$", content)
        self.assertEqual(failure["rank"], f"{local_rank} (local_rank: {local_rank})", agent.describe())
        self.assertEqual(failure["exitcode"], "1 (exitcode 1)", agent.describe())
        self.assertEqual(failure["error_file"], path, agent.describe())
        self.assertEqual(failure["message"], message, agent.describe())
        tb = failure["traceback"]
        self.assertTrue(tb.startswith("Traceback (most recent call last):"), agent.describe())
        self.assertIn(", in explode\n", tb, agent.describe())
        self.assertTrue(tb.endswith(message), agent.describe())
        self.assertEqual(tb, content["message"]["extraInfo"]["py_callstack"].rstrip("\n"))
        return int(content["message"]["extraInfo"]["timestamp"])

    def test_summary_shows_the_error_file(self):
        agent, rc = self.run_job({1: "raise"})
        self.assertEqual(rc, 1, agent.describe())
        root, others = parse_summary(agent.stderr())
        ts = self.assert_shows_error_file(root, 1, agent)
        self.assertLessEqual(abs(ts - time.time()), 300)
        # Rank 0 was stopped by the agent's SIGTERM: no error file, not a failure of its own.
        self.assertEqual(others, [], agent.describe())
        self.assertIn("<NO_OTHER_FAILURES>", agent.stderr())
        self.assertEqual(glob.glob(self.path("logs", "*", "attempt_0", "0", "error.json")), [])

    def test_root_cause_is_the_oldest_error_file(self):
        # Rank 1 raises first but lingers 8 s before it exits (ignoring SIGTERM); rank 0 raises a second later
        # and exits at once: the agent sees rank 0 fail first, yet the root cause is rank 1.
        agent, rc = self.run_job({1: "raise_linger", 0: "raise_after:1"})
        self.assertEqual(rc, 1, agent.describe())
        out = agent.output()
        first = re.search(r"worker local_rank (\d) \(rank \d, pid \d+\) failed", out)
        self.assertIsNotNone(first, agent.describe())
        self.assertEqual(first.group(1), "0", "rank 0 was meant to exit first\n" + agent.describe())
        root, others = parse_summary(agent.stderr())
        ts1 = self.assert_shows_error_file(root, 1, agent)
        self.assertEqual(len(others), 1, agent.describe())
        ts0 = self.assert_shows_error_file(others[0], 0, agent)
        self.assertLess(ts1, ts0)


if __name__ == "__main__":
    unittest.main()
