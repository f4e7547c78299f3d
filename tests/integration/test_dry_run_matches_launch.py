"""--dry-run against the real launch: for each flag combination, `ddprun --dry-run ARGS` and `ddprun ARGS` with
a tiny Python worker that records what it really got - its environment, its argv (/proc/self/cmdline) - and
writes one line on stdout and one on stderr. Every variable the plan prints must be what the workers got (a
placeholder stands for what only the run decides: the run directory's random part, a port the store binds,
values decided at the rendezvous), the plan must print every such variable the workers have, and each stream
must reach exactly the console (with the prefix shown) and the file the plan names. Loopback only, no root.
"""
import copy
import json
import os
import re
import shlex
import unittest

from ddprun_testlib import HOST_PYTHON, IntegrationTestCase, free_port

WAIT = 60  # seconds: generous bound for a two-worker job on a busy 2-core machine

# Writes out_dir/<LOCAL_RANK>.json ({"env": ..., "argv": ...}), then one line on stdout and one on stderr.
WORKER = r"""
import json, os, sys
rank = os.environ["LOCAL_RANK"]
with open("/proc/self/cmdline", "rb") as f:
    argv = [a.decode() for a in f.read().split(b"\0")[:-1]]
path = os.path.join(sys.argv[1], rank + ".json")
with open(path + ".tmp", "w") as f:
    json.dump({"env": dict(os.environ), "argv": argv}, f)
os.replace(path + ".tmp", path)
print("stdout-line-" + rank, flush=True)
print("stderr-line-" + rank, file=sys.stderr, flush=True)
"""

# launcher/dry_run.h: is_plan_env_var().
PLAN_VARS = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
             "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
             "CUDA_VISIBLE_DEVICES"}
PLAN_VAR_PREFIXES = ("TORCHELASTIC_", "TORCH_NCCL_", "DDPRUN_", "NCCL_")

# The placeholders of launcher/dry_run.h and what each stands for.
PLACEHOLDERS = {
    "<decided at the rendezvous>": r".+",
    "<chosen when the store binds>": r"[1-9][0-9]*",
    "<pid>": r"[1-9][0-9]*",  # the agent's pid, in a c10d console prefix
    "XXXXXXXX": r"[a-z0-9_]{8}",  # agent::LogLayout::create (Python's tempfile alphabet)
    "XXXXXX": r"[A-Za-z0-9]{6}",  # mkdtemp(3)
}
PLACEHOLDER = re.compile("|".join(re.escape(p) for p in PLACEHOLDERS))


def is_plan_var(name):
    return name in PLAN_VARS or name.startswith(PLAN_VAR_PREFIXES)


def shown_as_regex(shown):
    """A regular expression for the real values `shown` (a dry-run value) may stand for."""
    parts, pos = [], 0
    for m in PLACEHOLDER.finditer(shown):
        parts += [re.escape(shown[pos:m.start()]), PLACEHOLDERS[m.group()]]
        pos = m.end()
    return "".join(parts) + re.escape(shown[pos:])


def parse_plan(text):
    """{local rank: {"rank", "argv", "stdout", "stderr", "env": {name: value}}} from a --dry-run output."""
    workers, current = {}, None
    for line in text.splitlines():
        m = re.fullmatch(r"worker local_rank (\d+) \(rank (.+)\):", line)
        if m:
            current = workers[int(m[1])] = {"rank": m[2], "env": {}}
        elif current is None:
            continue
        elif line.startswith("  argv: "):
            current["argv"] = shlex.split(line[len("  argv: "):])
        elif line.startswith(("  stdout: ", "  stderr: ")):
            current[line[2:8]] = line[len("  stdout: "):]
        elif line.startswith("    "):
            name, _, value = line[4:].partition("=")
            current["env"][name] = value
    return workers


class Launch:
    """What the workers of a real launch got: per local rank env and argv, the console, and the log files."""

    def __init__(self, records, stdout, stderr):
        self.records = records  # local rank -> {"env": ..., "argv": ...}
        self.console = {"stdout": stdout.splitlines(), "stderr": stderr.splitlines()}

    def log_file(self, local_rank, stream):
        """The worker's real <stream>.log path (beside its TORCHELASTIC_ERROR_FILE, agent/log_layout.h)."""
        error_file = self.records[local_rank]["env"]["TORCHELASTIC_ERROR_FILE"]
        return os.path.join(os.path.dirname(error_file), stream + ".log")


def stream_mismatches(local_rank, stream, shown, launch):
    """Where the plan says one stream goes ("console (prefix P) + file PATH", "discarded ...") vs. the launch."""
    text = f"{stream}-line-{local_rank}"
    parts = shown.split(" + ")
    console = [re.fullmatch(r"console(?: \(prefix (.+)\))?", p) for p in parts if p.startswith("console")]
    files = [p[len("file "):] for p in parts if p.startswith("file ")]
    where = f"local rank {local_rank} {stream} (plan: {shown})"
    problems = []
    lines = launch.console[stream]
    line = shown_as_regex(console[0][1] or "") + re.escape(text) if console else None
    if console and not any(re.fullmatch(line, real) for real in lines):
        problems.append(f"{where}: no console line matches {line!r}: {lines}")
    if not console and any(text in line for line in lines):
        problems.append(f"{where}: {text!r} reached the console")
    real = launch.log_file(local_rank, stream)
    kept = os.path.isdir(os.path.dirname(real))  # the agent's temporary directory is gone after a success
    if files and not re.fullmatch(shown_as_regex(files[0]), real):
        problems.append(f"{where}: the agent wrote {real}")
    elif files and kept:
        with open(real) as f:
            if text not in f.read():
                problems.append(f"{where}: {text!r} is not in {real}")
    elif not files and kept and os.path.exists(real):
        problems.append(f"{where}: the agent wrote {real} too")
    return problems


def mismatches(plan, launch):
    """Every difference between a parsed plan and a real launch, as readable lines (empty: they agree)."""
    problems = []
    if sorted(plan) != sorted(launch.records):
        return [f"local ranks: plan {sorted(plan)}, launch {sorted(launch.records)}"]
    for lr, shown in sorted(plan.items()):
        env, argv = launch.records[lr]["env"], launch.records[lr]["argv"]
        if shown["argv"] != argv:
            problems.append(f"local rank {lr}: argv {shown['argv']} shown, {argv} run")
        real_names = {name for name in env if is_plan_var(name)}
        if real_names != set(shown["env"]):
            problems.append(f"local rank {lr}: variables only shown {sorted(set(shown['env']) - real_names)}, "
                            f"only set {sorted(real_names - set(shown['env']))}")
        for name, value in sorted(shown["env"].items()):
            if name in env and not re.fullmatch(shown_as_regex(value), env[name]):
                problems.append(f"local rank {lr}: {name}={value} shown, {env[name]} set")
        rank = shown["env"].get("RANK", "")
        if shown["rank"] != (rank if "<" not in rank else "decided at the rendezvous"):
            problems.append(f"local rank {lr}: header rank {shown['rank']}, RANK={rank}")
        for stream in ("stdout", "stderr"):
            problems += stream_mismatches(lr, stream, shown[stream], launch)
    return problems


class DryRunMatchesLaunch(IntegrationTestCase):
    def setUp(self):
        super().setUp()
        self.worker = self.path("worker.py")
        with open(self.worker, "w") as f:
            f.write(WORKER)

    def dry_run_and_launch(self, args, nproc):
        """(parsed plan, Launch) of `args` + the worker, run with --dry-run and then for real."""
        out = self.path(f"records-{len(self.agents)}")
        os.mkdir(out)
        flags, script = [*args, "--python", HOST_PYTHON], [self.worker, out]
        env = {"TMPDIR": self.tmp}  # the agent's temporary log directory: inside this test's directory
        dry, rc = self.run_agent([*flags, "--dry-run", *script], WAIT, env=env)
        self.assertEqual(rc, 0, dry.describe())
        plan = parse_plan(dry.stdout())
        self.assertEqual(sorted(plan), list(range(nproc)), dry.stdout())
        self.assertEqual(os.listdir(out), [], "--dry-run started a worker")
        real, rc = self.run_agent([*flags, *script], WAIT, env=env)
        self.assertEqual(rc, 0, real.describe())
        records = {}
        for lr in range(nproc):
            with open(os.path.join(out, f"{lr}.json")) as f:
                records[lr] = json.load(f)
        return plan, Launch(records, real.stdout(), real.stderr()), dry.stdout()

    def check(self, args, nproc):
        plan, launch, text = self.dry_run_and_launch(args, nproc)
        problems = mismatches(plan, launch)
        self.assertEqual(problems, [], "--dry-run disagrees with the launch:\n" + "\n".join(problems) +
                         "\n--- dry run ---\n" + text)
        return plan, launch

    def test_static_single_node(self):
        plan, launch = self.check(["--nproc_per_node", "2", "--master_port", str(free_port())], 2)
        # The comparison fails on a plan that is wrong: an error file without the run directory (as --dry-run
        # printed it before), a wrong world size, a stream sent elsewhere.
        wrong = copy.deepcopy(plan)
        wrong[0]["env"]["TORCHELASTIC_ERROR_FILE"] = "<log_dir>/attempt_0/0/error.json"
        wrong[1]["env"]["WORLD_SIZE"] = "4"
        wrong[1]["stdout"] = "file " + launch.log_file(1, "stdout")
        problems = "\n".join(mismatches(wrong, launch))
        self.assertIn("local rank 0: TORCHELASTIC_ERROR_FILE=<log_dir>/attempt_0/0/error.json shown", problems)
        self.assertIn("local rank 1: WORLD_SIZE=4 shown, 2 set", problems)
        self.assertIn("local rank 1 stdout (plan: file", problems)

    def test_redirect_and_tee_of_stdout_with_a_log_dir(self):
        self.check(["-r1", "-t1", "--log_dir", self.path("logs"), "--master_port", str(free_port())], 1)

    def test_local_ranks_filter_and_per_rank_tee(self):
        self.check(["--nproc_per_node", "2", "--local_ranks_filter", "1", "-t", "0:3", "-r", "1:1",
                    "--log_dir", self.path("logs"), "--rdzv_id", "filtered", "--master_port", str(free_port())], 2)

    def test_standalone_port_chosen_at_bind(self):
        plan, _ = self.check(["--standalone", "--nproc_per_node", "2", "--rdzv_id", "solo"], 2)
        self.assertEqual(plan[0]["env"]["MASTER_PORT"], "<chosen when the store binds>")

    def test_c10d_on_loopback_leaves_ranks_to_the_rendezvous(self):
        plan, _ = self.check(["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
                              "--nproc_per_node", "2", "--rdzv_id", "elastic", "-t", "1"], 2)
        self.assertEqual(plan[1]["env"]["RANK"], "<decided at the rendezvous>")

    def test_hang_detection_variables(self):
        self.check(["--hang_timeout", "120", "--log_dir", self.path("logs"), "--master_port", str(free_port())], 1)


if __name__ == "__main__":
    unittest.main()
