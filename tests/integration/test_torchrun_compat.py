"""ddprun beside torchrun, run on the same machine with the same worker (compat_worker.py): what a job sees that
used to differ (issue 25). torchrun is the workers' own (`PYTHON -m torch.distributed.run`): 1.13 on the host,
2.6 in the .torch26 variant. Debian's 1.13 on Python 3.11 needs -r and -t with values 1 or 2 (see
test_pytorch_errors.runs_on_113) and has neither --local_ranks_filter nor TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE:
where 1.13 cannot run a case, ddprun is checked against the output torch 2.6 gives (written out below).

- Console: without --tee a worker's lines reach the console as it wrote them (--local_ranks_filter too);
  tee'd lines get "[default0]:" or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE's prefix; a tqdm-style redraw
  ("\\r10%") is on the console while the worker still runs, also with two workers (ddprun's pump).
- Environment: --standalone's MASTER_ADDR and UUID run id; the NCCL variable the workers' torch reads.
- The launcher's own TORCHELASTIC_ERROR_FILE: the root cause's error file, errorCode added; torch's record of
  the SIGTERM that ended the launcher.
- Exit codes: a worker SIGKILLed (as by the OOM killer) and SIGTERM to the launcher: torchrun 1, ddprun 137 and
  143, and 1 with --exit_codes torchrun; the failure summary the same text.
- What torchrun takes: an abbreviated flag, --rdzv_conf keys ddprun does not use (a warning names them).
"""
import json
import os
import re
import signal
import socket
import unittest
import uuid

from ddprun_testlib import (EXPECTED_TORCH, PYTHON, IntegrationTestCase, free_port, read_pidfile, torch_subject,
                            wait_until)
from test_pytorch_errors import masked, summary_block

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat_worker.py")
WAIT = 120  # seconds for one short job
TORCH_113 = not (EXPECTED_TORCH or "").startswith("2.")
FLAGS_113 = ["-r", "1", "-t", "1"] if TORCH_113 else []  # Debian's 1.13 crashes without them
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
# The launchers' own lines on stderr: torch's logging ("W1126 09:41:56.867000 6825 torch/...] ...", 1.13's
# "WARNING:torch.distributed.run:" / "ERROR:torch.distributed.elastic...:" and its banner) and ddprun's ("ddprun: ...", "[09:41:56.867] ddprun ...").
LAUNCHER_LINE = re.compile(r"^([IWEC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ |(INFO|WARNING|ERROR):torch|\*{5}|"
                           r"Setting OMP_NUM_THREADS|"
                           r"ddprun: |\[\d\d:\d\d:\d\d\.\d{3}\] ddprun)")


# The first frame of a traceback torchrun itself prints (its main, or an exception its agent logs).
LAUNCHER_FRAME = re.compile(r'^  File "(<frozen runpy>|/usr/bin/torchrun|/usr/lib/python3[^"]*/torch/)')
# A warning of torch's C++ side with the stack under it ("[W1126 12:35:13.844156907 TCPStore.cpp:115] [c10d]
# recvVector failed ...", "Exception raised from ...", "frame #0: ..."): torchrun 2.6's elastic agent prints
# them when the rendezvous host's agent ended before it shut the rendezvous down.
C10_LINE = re.compile(r"^\[[IWEC]\d{4} \d\d:\d\d:\d\d\.\d+ ")


def worker_lines(stderr):
    """The workers' lines of a launcher's stderr, up to the failure summary: the launcher's own log lines, and
    torchrun's Python tracebacks (their first frame is torch's, torchrun's or runpy's: its main's, or one its
    agent logs, as 1.13 does when its exit barrier fails) and C++ warnings with their stacks, each up to the
    launcher's next line, left out."""
    lines = stderr.splitlines()
    kept = []
    in_launcher_block = False
    for i, line in enumerate(lines):
        next_line = lines[i + 1] if i + 1 < len(lines) else ""
        if "ChildFailedError" in line:
            break
        if C10_LINE.match(line) or (line.startswith("Traceback (most recent call last)") and
                                    LAUNCHER_FRAME.match(next_line)):
            in_launcher_block = True
        elif LAUNCHER_LINE.match(line):
            in_launcher_block = False
        elif line and not in_launcher_block:
            kept.append(line)
    return kept


@torch_subject
class TorchrunCompat(IntegrationTestCase):
    def launch(self, launcher, flags, modes, env=None, out=None):
        """Starts torchrun ("torch") or ddprun with `flags` and compat_worker.py in COMPAT_MODE `modes`. torch
        1.13's --standalone is its c10d rendezvous on localhost:29400, a port every concurrent 1.13 job shares
        (a second one joins the first one's store, or fails): it gets the same rendezvous on a free port."""
        out = out or self.path(f"out-{launcher}")
        os.makedirs(out, exist_ok=True)
        full_env = {"COMPAT_MODE": ",".join(modes), "COMPAT_OUT": out, "OMP_NUM_THREADS": "1", **(env or {})}
        if launcher == "torch":
            if TORCH_113:
                own = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"localhost:{free_port()}", "--nnodes", "1",
                       "--rdzv_id", str(uuid.uuid4())]
                flags = [f for flag in flags for f in (own if flag in ("--standalone", "--stand") else [flag])]
            return self.start(["-m", "torch.distributed.run", "--monitor_interval", "0.1", *flags, WORKER],
                              env=full_env, program=PYTHON)
        return self.start([*flags, "--python", PYTHON, WORKER], env=full_env)

    def run_both(self, flags, modes, env=None, torch_too=True):
        """Both launchers, one after the other: {launcher: (agent, exit code)}."""
        runs = {}
        for launcher in (["ddprun", "torch"] if torch_too else ["ddprun"]):
            agent = self.launch(launcher, flags, modes, env)
            runs[launcher] = (agent, agent.wait(WAIT))
        return runs

    def test_console_lines_are_the_workers_own_without_tee(self):
        # --local_ranks_filter alone: rank 0's lines as written, no "[default0]:" (torch 1.13: no such flag).
        flags = ["--standalone", "--nproc_per_node", "2", "--local_ranks_filter", "0"]
        for launcher, (agent, rc) in self.run_both(flags, ["lines"], torch_too=not TORCH_113).items():
            self.assertEqual(rc, 0, agent.describe())
            self.assertEqual(agent.stdout(), '{"rank": 0, "local_rank": 0, "world_size": 2}\n', agent.describe())
            self.assertEqual(worker_lines(agent.stderr()), ["err 0"], agent.describe())

    def test_teed_lines_get_torchs_prefix_or_the_template(self):
        # -r 2 -t 1: stdout tee'd (prefixed), stderr to its file only; both torch versions run that.
        flags = ["--standalone", "--nproc_per_node", "1", "-r", "2", "-t", "1", "--log_dir", self.path("logs")]
        line = '{"rank": 0, "local_rank": 0, "world_size": 1}\n'
        for launcher, (agent, rc) in self.run_both(flags, ["lines"]).items():
            self.assertEqual(rc, 0, agent.describe())
            self.assertEqual(agent.stdout(), "[default0]:" + line, agent.describe())
            self.assertEqual(worker_lines(agent.stderr()), [], agent.describe())
        template = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}-r${rank}-l${local_rank}] $$ "}
        for launcher, (agent, rc) in self.run_both(flags, ["lines"], template, torch_too=not TORCH_113).items():
            self.assertEqual(rc, 0, agent.describe())
            self.assertEqual(agent.stdout(), "[default-r0-l0] $ " + line, agent.describe())

    def test_a_progress_bar_is_live_with_two_workers(self):
        # Without -r/-t torch 1.13 cannot run; 2.6 writes straight to the console. ddprun passes the two
        # workers' lines through its pump: the first update must be there before the second is written.
        for launcher in ["ddprun"] if TORCH_113 else ["ddprun", "torch"]:
            out = self.path(f"progress-{launcher}")
            agent = self.launch(launcher, ["--standalone", "--nproc_per_node", "2"], ["progress"], out=out)
            wait_until(lambda: "10%" in agent.stdout(), 60, f"{launcher}: the first update on the console",
                       agent.describe)
            self.assertEqual(agent.stdout(), "\r10%", agent.describe())
            open(os.path.join(out, "go"), "w").close()
            self.assertEqual(agent.wait(WAIT), 0, agent.describe())
            self.assertEqual(agent.stdout(), "\r10%\r20%\n", agent.describe())

    def test_environment_of_standalone_workers(self):
        envs = {}
        flags = ["--standalone", "--nproc_per_node", "1", *FLAGS_113]
        for launcher, (agent, rc) in self.run_both(flags, ["env"]).items():
            self.assertEqual(rc, 0, agent.describe())
            with open(self.path(f"out-{launcher}", "env-0.json")) as f:
                envs[launcher] = json.load(f)
        # torch 1.13's agent advertises its host name (socket.getfqdn()); ddprun does what torch 2.x does.
        expected_addr = {"ddprun": "localhost",
                         "torch": socket.getfqdn(socket.gethostname()) if TORCH_113 else "localhost"}
        for launcher, env in envs.items():
            self.assertEqual(env["MASTER_ADDR"], expected_addr[launcher], (launcher, env))
            self.assertRegex(env["TORCHELASTIC_RUN_ID"], UUID, launcher)
        self.assertNotEqual(envs["ddprun"]["TORCHELASTIC_RUN_ID"], envs["torch"]["TORCHELASTIC_RUN_ID"])
        for env in envs.values():
            env.pop("TORCHELASTIC_RUN_ID")
            env.pop("MASTER_ADDR")
            # torch 1.13's c10d lets worker 0 host the workers' store ("False"); ddprun's agent always does.
            env.pop("TORCHELASTIC_USE_AGENT_STORE")
        self.assertEqual(envs["ddprun"], envs["torch"])
        nccl = ("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
        self.assertEqual([envs["ddprun"][k] for k in nccl], ["1", None] if TORCH_113 else [None, "1"])

    def error_files(self, flags, modes, expected_rc, stop=None):
        """Runs both launchers with TORCHELASTIC_ERROR_FILE set for them: {launcher: (agent, its content)}."""
        found = {}
        for launcher in ("ddprun", "torch"):
            parent = self.path(f"parent-{launcher}.json")
            agent = self.launch(launcher, flags, modes, {"TORCHELASTIC_ERROR_FILE": parent})
            if stop:
                stop(agent, self.path(f"out-{launcher}"))
            rc = agent.wait(WAIT)
            self.assertEqual(rc, expected_rc[launcher], agent.describe())
            with open(parent) as f:
                text = f.read()
            found[launcher] = (agent, text)
        return found

    def test_the_root_cause_error_file_is_copied_to_the_launchers(self):
        flags = ["--standalone", "--nproc_per_node", "2", *FLAGS_113]
        found = self.error_files(flags, ["raise:1"], {"ddprun": 1, "torch": 1})
        texts = {}
        for launcher, (agent, text) in found.items():
            content = json.loads(text)
            self.assertEqual(content["message"]["message"], "ValueError: compat_worker rank 1 failed on purpose",
                             agent.describe())
            self.assertEqual(content["message"]["errorCode"], 1, text)
            self.assertRegex(content["message"]["extraInfo"]["timestamp"], r"^\d+$")
            texts[launcher] = re.sub(r'"timestamp": "\d+"', '"timestamp": "<t>"', text)
        self.assertEqual(texts["ddprun"], texts["torch"])  # json.dumps's text, byte for byte

    def test_sigterm_to_the_launcher(self):
        def terminate(agent, out):
            wait_until(lambda: read_pidfile(os.path.join(out, "pid-0")), 60, "the worker's pid file", agent.describe)
            agent.signal(signal.SIGTERM)

        flags = ["--standalone", "--nproc_per_node", "1", *FLAGS_113]
        found = self.error_files(flags, ["wait"], {"ddprun": 143, "torch": 1}, stop=terminate)
        texts = {launcher: re.sub(r"Process \d+ got", "Process <pid> got", text) for launcher, (_, text) in found.items()}
        ours, theirs = json.loads(texts["ddprun"]), json.loads(texts["torch"])
        self.assertEqual(ours["message"]["message"], "SignalException: Process <pid> got signal: 15")
        self.assertEqual(ours["message"]["message"], theirs["message"]["message"])
        out = self.path("out-exit-codes")
        agent = self.launch("ddprun", flags + ["--exit_codes", "torchrun"], ["wait"], out=out)
        terminate(agent, out)
        self.assertEqual(agent.wait(WAIT), 1, agent.describe())

    def test_a_worker_killed_as_by_the_oom_killer(self):
        flags = ["--standalone", "--nproc_per_node", "1", *FLAGS_113]
        blocks = {}
        for launcher, expected in (("ddprun", 137), ("torch", 1)):
            out = self.path(f"oom-{launcher}")
            agent = self.launch(launcher, flags, ["wait"], out=out)
            pid = wait_until(lambda: read_pidfile(os.path.join(out, "pid-0")), 60, "the worker's pid", agent.describe)
            os.kill(pid, signal.SIGKILL)
            self.assertEqual(agent.wait(WAIT), expected, agent.describe())
            blocks[launcher] = masked(summary_block(agent.stderr()))
        self.assertEqual(blocks["ddprun"], blocks["torch"])
        self.assertIn("  traceback : Signal 9 (SIGKILL) received by PID <pid>", blocks["ddprun"])

    def test_what_torchruns_argparse_takes(self):
        flags = ["--stand", "--nproc_per", "1", "--rdzv_conf", "store_type=tcp,foo=bar", *FLAGS_113]
        runs = self.run_both(flags, ["lines"])
        for launcher, (agent, rc) in runs.items():
            self.assertEqual(rc, 0, agent.describe())
            self.assertIn('{"rank": 0, "local_rank": 0, "world_size": 1}', agent.stdout(), agent.describe())
        self.assertIn("ddprun: warning: --rdzv_conf: ignoring foo=bar (not a key ddprun uses)\n",
                      runs["ddprun"][0].stderr())


if __name__ == "__main__":
    unittest.main()
