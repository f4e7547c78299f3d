"""Torch's @record error files and torchrun's failure summary and --log_dir files, under ddprun and under
torchrun itself, with the workers' own torch (1.13; 2.6 in the .torch26 variant).

RecordErrorFiles: the failure summary shows the traceback read from the error file and names the file; a
worker the agent stopped is not listed; with two failing ranks the root cause is the one whose error file is
older, even when the other one exited first. Workers: tests/integration/record_worker.py.

TorchrunParity: the same jobs under `python -m torch.distributed.run` and ddprun.
- The failure summary (ChildFailedError's block) is the same text, with times, pids, hosts, the run
  directory's name and the width of the rules (which follows the pid's digits) masked; the rule width is
  checked against torch's rule (min(60, widest line)) on both sides, and ddprun's host against this machine's
  socket.getfqdn().
- The files under <log_dir>/<run_id>_<rand>/ are the same for -r, -t, --local_ranks_filter and their
  combinations, with and without an @record error file. LOG_CASES holds the trees torch 2.6 wrote (recorded
  from torchrun 2.6 itself); ddprun is always checked against them, and torchrun is run for every case to
  check that they are still torch's. Torch 1.13 writes the same trees, but Debian's 1.13.1 on Python 3.11
  crashes on any -r/-t value 0 or 3 (so also without -r or -t) and has no --local_ranks_filter: with 1.13 only
  the cases it can run are compared with it. DDPRUN_IT_QUICK=1 runs torchrun for QUICK_CASES only (ddprun
  still runs every case against the recorded trees).

InterpreterPreflight (host torch only: no torch in it): ddprun's preflight starts the interpreter once (`-S -c ''`) before the rendezvous: a
broken one is one line and exit 2 at once (where the rendezvous would wait for its join timeout), nothing
started; a busy store port is the store's "port in use" and exit 3 before even that.
"""
import concurrent.futures
import glob
import json
import os
import re
import shutil
import socket
import time
import unittest

from ddprun_testlib import EXPECTED_TORCH, HOST_PYTHON, PYTHON, IntegrationTestCase, free_port, torch_subject

RECORD_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "record_worker.py")
JOB_WAIT = 150  # seconds for one short job (every worker imports torch: seconds each on a small machine)
QUICK = os.environ.get("DDPRUN_IT_QUICK") == "1"
TORCH_113 = not (EXPECTED_TORCH or "").startswith("2.")
CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
FIELD = re.compile(r"^  (time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
FIXED_LINES = ("Failures:", "  <NO_OTHER_FAILURES>", "Root Cause (first observed failure):")


def summary_block(stderr):
    """The lines of torchrun's failure summary in `stderr`: from the ChildFailedError line to the closing
    '=' rule (the last such block)."""
    lines = stderr.splitlines()
    start = max(i for i, line in enumerate(lines) if line == CHILD_FAILED)
    rule = lines[start + 1]
    assert rule and set(rule) == {"="}, f"no '=' rule after the ChildFailedError line:\n{stderr[-3000:]}"
    end = lines.index(rule, start + 2)
    return lines[start:end + 1]


def parse_failure(lines):
    """One failure of the block ("[idx]:" then its fields) as a dict; the traceback is torch's text with its
    two-space indentation of continuation lines undone."""
    fields = {"idx": int(lines[0][1:-2])}
    for i, line in enumerate(lines[1:], 1):
        m = FIELD.match(line)
        if not m:
            continue
        if m.group(1) == "traceback":
            fields["traceback"] = "\n".join([m.group(2)] + [l[2:] for l in lines[i + 1:]])
            break
        fields[m.group(1)] = m.group(2)
    return fields


def parse_summary(stderr):
    """(root cause, [other failures], block lines) of the failure summary on stderr."""
    block = summary_block(stderr)
    section = block[3]
    root_at = block.index("Root Cause (first observed failure):")
    others_lines = block[block.index("Failures:") + 1:block.index(section, 4)]
    others, current = [], None
    for line in others_lines:
        if re.fullmatch(r"\[\d+\]:", line):
            current = [line]
            others.append(current)
        elif current is not None:
            current.append(line)
    root = parse_failure(block[root_at + 1:-1])
    return root, [parse_failure(o) for o in others], block


def check_rule_width(test, block, who):
    """torch's rule: min(60, the widest of the title and every failure's lines)."""
    rule = block[1]
    body = [l for l in block[2:-1] if l not in FIXED_LINES and l != "-" * len(rule)]
    test.assertEqual(len(rule), min(60, max(len(l) for l in body)), f"{who}'s rule width\n" + "\n".join(block))
    test.assertEqual(block[3], "-" * len(rule), "\n".join(block))
    test.assertEqual(block[-1], rule, "\n".join(block))


def masked(block):
    """The block with what differs between two runs replaced: times, hosts, pids, the log directory and run
    directory of error files, and the rules' width."""
    out = []
    for line in block[1:]:
        if line and set(line) in ({"="}, {"-"}):
            out.append(f"<rule {line[0]}>")
            continue
        line = re.sub(r"^(  time      : ).*", r"\1<time>", line)
        line = re.sub(r"^(  host      : ).*", r"\1<host>", line)
        line = re.sub(r"\(pid: \d+\)", "(pid: <pid>)", line)
        line = re.sub(r"received by PID \d+", "received by PID <pid>", line)
        line = re.sub(r"^(  error_file: )/\S+/[^/\s]+_[a-z0-9_]{8}/", r"\1<run dir>/", line)
        out.append(line)
    return [block[0]] + out


@torch_subject
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
        """`failure` (from the summary) shows local rank `local_rank`'s error file: path and traceback."""
        path, content = self.error_file(local_rank)
        message = f"ValueError: record_worker rank {local_rank} failed on purpose"
        # torch's @record layout (1.13 and 2.6 alike): the agent reads it, so the test pins it.
        self.assertEqual(content["message"]["message"], message, content)
        self.assertRegex(content["message"]["extraInfo"]["timestamp"], r"^\d+$", content)
        self.assertEqual(failure["rank"], f"{local_rank} (local_rank: {local_rank})", agent.describe())
        self.assertRegex(failure["exitcode"], r"^1 \(pid: \d+\)$", agent.describe())
        self.assertEqual(failure["error_file"], path, agent.describe())
        self.assertEqual(failure["host"], socket.getfqdn(), agent.describe())
        tb = failure["traceback"]
        self.assertTrue(tb.startswith("Traceback (most recent call last):"), agent.describe())
        self.assertIn(", in explode\n", tb, agent.describe())
        self.assertTrue(tb.endswith(message + "\n"), agent.describe())
        self.assertEqual(tb, content["message"]["extraInfo"]["py_callstack"])
        return int(content["message"]["extraInfo"]["timestamp"])

    def test_summary_shows_the_error_file(self):
        agent, rc = self.run_job({1: "raise"})
        self.assertEqual(rc, 1, agent.describe())
        root, others, block = parse_summary(agent.stderr())
        ts = self.assert_shows_error_file(root, 1, agent)
        self.assertEqual(root["idx"], 0)
        self.assertLessEqual(abs(ts - time.time()), 300)
        self.assertEqual(root["time"], time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(ts)))
        check_rule_width(self, block, "ddprun")
        # Rank 0 was stopped by the agent's SIGTERM: no error file, not a failure of its own.
        self.assertEqual(others, [], agent.describe())
        self.assertIn("  <NO_OTHER_FAILURES>", block)
        self.assertEqual(glob.glob(self.path("logs", "*", "attempt_0", "0", "error.json")), [])

    def test_root_cause_is_the_oldest_error_file(self):
        # Rank 1 raises first but lingers until the agent stops it; rank 0 raises a second later and exits at
        # once: the agent sees rank 0 fail first, yet the root cause is rank 1.
        agent, rc = self.run_job({1: "raise_linger", 0: "raise_after:1"})
        self.assertEqual(rc, 1, agent.describe())
        out = agent.output()
        first = re.search(r"worker local_rank (\d) \(rank \d, pid \d+\) failed", out)
        self.assertIsNotNone(first, agent.describe())
        self.assertEqual(first.group(1), "0", "rank 0 was meant to exit first\n" + agent.describe())
        root, others, block = parse_summary(agent.stderr())
        ts1 = self.assert_shows_error_file(root, 1, agent)
        self.assertEqual(len(others), 1, agent.describe())
        ts0 = self.assert_shows_error_file(others[0], 0, agent)
        self.assertLess(ts1, ts0)
        # Numbered in local-rank order, as torch's dict of failures: the root cause is [1].
        self.assertEqual((others[0]["idx"], root["idx"]), (0, 1), "\n".join(block))
        check_rule_width(self, block, "ddprun")


# A worker for the parity tests: prints a line on stdout and on stderr; then, by $PARITY_MODE, on local rank 1
# only: "exit" exits 7, "segv" dies of SIGSEGV, "record" raises under torch's @record (error file); the other
# ranks wait to be stopped. Without a mode every rank exits 0.
PARITY_WORKER = r'''
import os, signal, sys, time
mode = os.environ.get("PARITY_MODE", "")
rank = int(os.environ["LOCAL_RANK"])

def main():
    print(f"out {rank}", flush=True)
    print(f"err {rank}", file=sys.stderr, flush=True)
    if not mode:
        return
    if rank != 1:
        time.sleep(120)
    elif mode == "exit":
        sys.exit(7)
    elif mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif mode == "record":
        raise ValueError("parity worker failed on purpose")

if mode == "record":
    from torch.distributed.elastic.multiprocessing.errors import record
    main = record(main)
main()
'''

# --log_dir cases: (flags, mode) -> the files and directories torchrun 2.6 left under its run directory
# <log_dir>/<run_id>_<rand>/ with --standalone --nproc_per_node 2 (directories end in "/"). Recorded from
# torchrun 2.6 (Debian's python3-torch 2.6.0), which TorchrunParity re-runs.
R0, R1 = "attempt_0/0/", "attempt_0/1/"
BOTH = [R0 + "stderr.log", R0 + "stdout.log", R1 + "stderr.log", R1 + "stdout.log"]
LOG_CASES = [
    ([], "", []),
    (["-r", "1"], "", [R0 + "stdout.log", R1 + "stdout.log"]),
    (["-r", "2"], "", [R0 + "stderr.log", R1 + "stderr.log"]),
    (["-r", "3"], "", BOTH),
    (["-t", "3"], "", BOTH),
    (["-r", "1", "-t", "2"], "", BOTH),
    (["-r", "0:1,1:2"], "", [R0 + "stdout.log", R1 + "stderr.log"]),
    (["-t", "0:3"], "", [R0 + "stderr.log", R0 + "stdout.log"]),
    (["-r", "2", "-t", "1:1"], "", [R0 + "stderr.log", R1 + "stderr.log", R1 + "stdout.log"]),
    (["--local_ranks_filter", "0"], "", []),
    (["--local_ranks_filter", "1", "-r", "1", "-t", "2"], "", BOTH),
    (["--local_ranks_filter", "0", "-t", "0:1"], "", [R0 + "stdout.log"]),
    ([], "record", [R1 + "error.json"]),
    (["-r", "3", "--local_ranks_filter", "0"], "record", BOTH + [R1 + "error.json"]),
    (["-r", "1", "-t", "2"], "record", BOTH + [R1 + "error.json"]),
    (["-t", "1:2"], "exit", [R1 + "stderr.log"]),
]
QUICK_CASES = {0, 3, 13}


def expected_tree(files):
    """The directories torch creates (attempt_0/ and one per local rank) plus `files`."""
    return sorted(set(["attempt_0/", R0, R1] + files))


def runs_on_113(flags):
    """Debian's torch 1.13.1 on Python 3.11 turns -r/-t values 0 and 3 into None (and crashes), also the
    default 0 of a flag not given; it has no --local_ranks_filter."""
    if "--local_ranks_filter" in flags or "-r" not in flags or "-t" not in flags:
        return False
    specs = [flags[i + 1] for i, f in enumerate(flags) if f in ("-r", "-t")]
    values = [item.split(":")[-1] for spec in specs for item in spec.split(",")]
    return all(v in ("1", "2") for v in values)


@torch_subject
class TorchrunParity(IntegrationTestCase):
    def setUp(self):
        super().setUp()
        self.worker = self.path("parity_worker.py")
        with open(self.worker, "w") as f:
            f.write(PARITY_WORKER)

    def launch(self, launcher, flags, mode, log_dir):
        """Starts torchrun ("torch") or ddprun with --standalone --nproc_per_node 2 and `flags`."""
        common = ["--standalone", "--nproc_per_node", "2", "--log_dir", log_dir] + flags
        env = {"PARITY_MODE": mode, "OMP_NUM_THREADS": "1"}
        if launcher == "torch":
            # torchrun looks at its workers every --monitor_interval (5 s by default): every failing case
            # waited that long for it.
            return self.start(["-m", "torch.distributed.run", "--monitor_interval", "0.1"] + common + [self.worker],
                              env=env, program=PYTHON)
        return self.start(common + ["--python", PYTHON, self.worker], env=env)

    def run_launcher(self, launcher, flags, mode, log_dir):
        """launch() into an empty log_dir and wait: (agent, exit code)."""
        shutil.rmtree(log_dir, ignore_errors=True)
        agent = self.launch(launcher, flags, mode, log_dir)
        return agent, agent.wait(JOB_WAIT)

    def tree(self, log_dir, who):
        """Sorted paths under the only run directory in log_dir (directories end in "/")."""
        runs = os.listdir(log_dir)
        self.assertEqual(len(runs), 1, f"{who}: {runs}")
        self.assertRegex(runs[0], r"^.+_[a-z0-9_]{8}$", who)
        run_dir = os.path.join(log_dir, runs[0])
        found = []
        for root, dirs, files in os.walk(run_dir):
            rel = os.path.relpath(root, run_dir)
            prefix = "" if rel == "." else rel + "/"
            found += [prefix + d + "/" for d in dirs] + [prefix + f for f in files]
        return sorted(found)

    def run_cases(self, launcher, cases, parallel):
        """Runs `cases` (indexes into LOG_CASES) with `launcher`, `parallel` at a time: {index: (tree, the
        launcher's command and output)}."""

        def one(i):
            flags, mode, _ = LOG_CASES[i]
            log_dir = self.path(f"{launcher}-{i}")
            agent, rc = self.run_launcher(launcher, flags, mode, log_dir)
            self.assertEqual(rc != 0, bool(mode), f"case {flags} {mode!r}\n{agent.describe()}")
            return i, (self.tree(log_dir, f"{launcher} {flags} {mode!r}"), agent.describe())

        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            return dict(pool.map(one, cases))

    def test_log_dir_files_are_torchruns(self):
        ours = self.run_cases("ddprun", range(len(LOG_CASES)), 2)
        for i, (flags, mode, files) in enumerate(LOG_CASES):
            self.assertEqual(ours[i][0], expected_tree(files), f"ddprun {flags} mode {mode!r}\n{ours[i][1]}")
        torch_cases = [i for i in range(len(LOG_CASES)) if not QUICK or i in QUICK_CASES]
        if TORCH_113:
            torch_cases = [i for i in torch_cases if runs_on_113(LOG_CASES[i][0])]
        self.assertTrue(torch_cases)
        # torchrun 1.13's --standalone binds the fixed port 29400 (2.x a free one): its runs go one at a time
        # (tests/CMakeLists.txt, DDPRUN_TORCH113_STANDALONE_LOCK).
        theirs = self.run_cases("torch", torch_cases, 1 if TORCH_113 else 4)
        for i in torch_cases:
            flags, mode, files = LOG_CASES[i]
            self.assertEqual(theirs[i][0], expected_tree(files),
                             f"torchrun {flags} mode {mode!r}: LOG_CASES is stale\n{theirs[i][1]}")
        print(f"log trees: ddprun {len(ours)} cases, torchrun {len(theirs)} cases "
              f"({'1.13' if TORCH_113 else EXPECTED_TORCH}{', quick' if QUICK else ''})")

    def summaries(self, mode):
        """(torchrun's block, ddprun's block, ddprun's whole stderr) for the same failing job, run at once."""
        flags = ["-r", "1", "-t", "2"] if TORCH_113 else []  # Debian's 1.13 needs -r and -t (see runs_on_113)
        ours = self.launch("ddprun", flags, mode, self.path("ddprun-logs"))
        torch, rc = self.run_launcher("torch", flags, mode, self.path("torch-logs"))
        self.assertEqual(rc, 1, torch.describe())
        ours.wait(JOB_WAIT)
        theirs, block = summary_block(torch.stderr()), summary_block(ours.stderr())
        check_rule_width(self, theirs, "torchrun")
        check_rule_width(self, block, "ddprun")
        root, _, _ = parse_summary(ours.stderr())
        self.assertEqual(root["host"], socket.getfqdn(), ours.describe())
        self.assertEqual(masked(block), masked(theirs),
                         "ddprun:\n" + "\n".join(block) + "\ntorchrun:\n" + "\n".join(theirs))
        return theirs, block, ours

    def test_summary_exit_code_without_error_file(self):
        _, block, agent = self.summaries("exit")
        self.assertEqual(agent.proc.returncode, 7, agent.describe())
        self.assertIn("  exitcode  : 7 (pid: ", "\n".join(block))

    def test_summary_signal(self):
        _, block, agent = self.summaries("segv")
        self.assertEqual(agent.proc.returncode, 128 + 11, agent.describe())
        self.assertIn("  traceback : Signal 11 (SIGSEGV) received by PID ", "\n".join(block))

    def test_summary_record_error_file(self):
        _, block, agent = self.summaries("record")
        self.assertEqual(agent.proc.returncode, 1, agent.describe())
        self.assertIn("ValueError: parity worker failed on purpose", "\n".join(block))


class InterpreterPreflight(IntegrationTestCase):
    def write_script(self, name, body):
        path = self.path(name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, 0o755)
        return path

    def test_a_broken_interpreter_is_one_line_and_exit_2_before_the_rendezvous(self):
        open(self.path("train.py"), "w").close()
        shim = self.write_script("python3", "echo \"pyenv: version \\`3.9' is not installed (set by PYENV_VERSION)\" >&2\n"
                                            "exit 127\n")
        # Node 1 of 2 with nobody else coming: the rendezvous would wait for its join timeout (600 s).
        lonely = ["--nnodes", "2", "--node_rank", "1", "--master_port", str(free_port()), "--nproc_per_node", "2"]
        start = time.monotonic()
        agent, rc = self.run_agent([*lonely, "--python", shim, "train.py"], 30)
        self.assertEqual(rc, 2, agent.describe())
        self.assertLess(time.monotonic() - start, 10, agent.describe())
        self.assertEqual(agent.stdout(), "", agent.describe())
        self.assertEqual(agent.stderr(), f"ddprun: the interpreter '{shim}' does not run: `{shim} -S -c ''` exited with "
                         "127: pyenv: version `3.9' is not installed (set by PYENV_VERSION); fix it, or give another "
                         "with --python PATH (or DDPRUN_PYTHON)\n")
        self.assertEqual(self.live_processes(), [])

    def test_a_bad_pythonhome_names_pythons_fatal_error(self):
        open(self.path("train.py"), "w").close()
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", "--python", HOST_PYTHON, "train.py"], 30,
                                   env={"PYTHONHOME": self.path("no-such-home")})
        self.assertEqual(rc, 2, agent.describe())
        self.assertRegex(agent.stderr(), rf"^ddprun: the interpreter '{HOST_PYTHON}' does not run: .* exited with 1: "
                                         r"Fatal Python error: [^\n]*; fix it, or give another with --python PATH[^\n]*\n$")

    def test_a_busy_store_port_is_exit_3_and_starts_not_even_the_interpreter(self):
        open(self.path("train.py"), "w").close()
        marker = self.path("interpreter-ran")
        python = self.write_script("python3", f"touch {marker}\nexit 0\n")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
            blocker.bind(("127.0.0.1", 0))
            blocker.listen()
            port = blocker.getsockname()[1]
            agent, rc = self.run_agent(["--nnodes", "1", "--master_port", str(port), "--python", python, "train.py"], 30)
        self.assertEqual(rc, 3, agent.describe())
        self.assertRegex(agent.stderr(), rf":{port}\b.*(in use|Address already)", agent.describe())
        self.assertFalse(os.path.exists(marker), "the interpreter was started although the port was busy")
        # With the port free the same launch starts it (once, for the check, then for the worker).
        agent, rc = self.run_agent(["--nnodes", "1", "--master_port", str(free_port()), "--python", python,
                                    "train.py"], 30)
        self.assertEqual(rc, 0, agent.describe())
        self.assertTrue(os.path.exists(marker))


if __name__ == "__main__":
    unittest.main()
