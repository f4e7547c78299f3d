"""ddprun's agent as a torchrun user sees it, with fake workers: environment, exit codes, restarts, failure
summary, log files and console output, --dry-run, command-line and start-up errors. Fast (no torch)."""
import glob
import os
import re
import signal
import socket
import time
import unittest

from ddprun_testlib import (AGENT_LOG_LINE, FAKE_WORKER, PYTHON, IntegrationTestCase, free_port,
                            read_json_file, wait_until)

WAIT = 60  # seconds: generous bound for a fake-worker job on a busy 2-core machine


class EnvContract(IntegrationTestCase):
    def dump_env_and_hang(self, nproc, extra_args=(), env=None, unset=()):
        """Starts nproc hanging workers that dumped their environment; returns (agent, [env per local rank])."""
        agent = self.start(["--standalone", "--nproc_per_node", str(nproc), *extra_args,
                            *self.fake("--dump-env", self.path("env_${local_rank}.json"), "--hang")],
                           env=env, unset=unset)
        paths = [self.path(f"env_{lr}.json") for lr in range(nproc)]

        def all_dumped():
            envs = [read_json_file(p) for p in paths]
            return envs if all(e is not None for e in envs) else None

        return agent, wait_until(all_dumped, WAIT, f"env dumps {paths}")

    def test_torchrun_environment_for_three_workers(self):
        agent, envs = self.dump_env_and_hang(
            3, ["--rdzv_id", "envjob-42", "--max_restarts", "3"],
            env={"DDPRUN_IT_INHERITED": "passes through"}, unset=["OMP_NUM_THREADS"])
        error_files = set()
        for lr, env in enumerate(envs):
            with self.subTest(local_rank=lr):
                expected = {
                    "RANK": str(lr), "LOCAL_RANK": str(lr), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
                    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(lr), "ROLE_NAME": "default",
                    "ROLE_WORLD_SIZE": "3", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3",
                    "TORCHELASTIC_RUN_ID": "envjob-42", "TORCHELASTIC_USE_AGENT_STORE": "True",
                    "OMP_NUM_THREADS": "1", "DDPRUN_IT_INHERITED": "passes through",
                }
                self.assertEqual({k: env.get(k) for k in expected}, expected)
                self.assertEqual(env["MASTER_ADDR"], envs[0]["MASTER_ADDR"])
                self.assertEqual(env["MASTER_PORT"], envs[0]["MASTER_PORT"])
                self.assertRegex(env["TORCHELASTIC_ERROR_FILE"], rf"attempt_0/{lr}/error\.json$")
                error_files.add(env["TORCHELASTIC_ERROR_FILE"])
        self.assertEqual(len(error_files), 3)
        # The agent store must accept connections at MASTER_ADDR:MASTER_PORT while the job runs.
        port = int(envs[0]["MASTER_PORT"])
        self.assertNotEqual(port, 0)
        with socket.create_connection((envs[0]["MASTER_ADDR"], port), timeout=10):
            pass
        agent.signal(signal.SIGTERM)
        self.assertEqual(agent.wait(WAIT), 128 + signal.SIGTERM, agent.describe())

    def test_omp_num_threads_kept_when_set(self):
        agent, envs = self.dump_env_and_hang(2, env={"OMP_NUM_THREADS": "5"})
        self.assertEqual([e["OMP_NUM_THREADS"] for e in envs], ["5", "5"])
        agent.signal(signal.SIGTERM)
        self.assertEqual(agent.wait(WAIT), 143, agent.describe())

    def test_omp_num_threads_not_set_for_one_worker(self):
        agent, envs = self.dump_env_and_hang(1, unset=["OMP_NUM_THREADS"])
        self.assertNotIn("OMP_NUM_THREADS", envs[0])
        agent.signal(signal.SIGTERM)
        self.assertEqual(agent.wait(WAIT), 143, agent.describe())

    def test_local_rank_substitution_in_script_args(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "3",
                                    *self.fake("--pidfile", self.path("pid_${local_rank}"),
                                               "--dump-env", self.path("env_$local_rank.json"))], WAIT)
        self.assertEqual(rc, 0, agent.describe())
        for lr in range(3):
            self.assertTrue(os.path.exists(self.path(f"pid_{lr}")), f"pid_{lr}")
            self.assertEqual(read_json_file(self.path(f"env_{lr}.json"))["LOCAL_RANK"], str(lr))
        self.assertFalse(glob.glob(self.path("*local_rank*")))


class ExitCodes(IntegrationTestCase):
    def test_worker_exit_code_passes_through(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "2", *self.fake("--exit", "7")], WAIT)
        self.assertEqual(rc, 7, agent.describe())

    def test_worker_killed_by_signal(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", *self.fake("--signal", "SEGV")],
                                   WAIT)
        self.assertEqual(rc, 128 + signal.SIGSEGV, agent.describe())
        self.assertIn("SIGSEGV", agent.stderr(), agent.describe())

    def test_first_failure_stops_a_hanging_sibling(self):
        ready = self.path("sibling_pid")
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "2", *self.rank_worker([
            {"rank": 0, "wait_for": ready, "args": ["--exit", "3"]},
            {"rank": 1, "args": ["--record-signals", self.path("sibling_signals"), "--pidfile", ready, "--hang"]},
        ])], WAIT)  # the sibling would hang forever: ending at all shows it was stopped
        self.assertEqual(rc, 3, agent.describe())
        with open(self.path("sibling_signals")) as f:
            self.assertEqual(f.read().split(), ["ready", "TERM"])
        self.assertEqual(self.live_processes(), [])


class Restarts(IntegrationTestCase):
    def test_succeeds_on_the_third_attempt(self):
        attempts = self.path("attempts")
        agent, rc = self.run_agent([
            "--standalone", "--nproc_per_node", "2", "--max_restarts", "2", "--log_dir", self.path("logs"),
            "--rdzv_id", "retry", *self.rank_worker([
                {"rank": 0, "attempt": [0, 1], "append": attempts, "exit": 1},
                {"append": attempts, "exit": 0},
            ])], WAIT)
        self.assertEqual(rc, 0, agent.describe())
        with open(attempts) as f:
            seen = sorted(f.read().split("\n")[:-1])
        # rank 1 may not have started when rank 0's failure stops attempts 0 and 1; attempt 2 must run both.
        self.assertEqual([s for s in seen if s.startswith("rank0")], ["rank0 attempt0", "rank0 attempt1",
                                                                      "rank0 attempt2"])
        self.assertIn("rank1 attempt2", seen)
        self.assertEqual(sorted(os.path.basename(p) for p in glob.glob(self.path("logs", "retry_*", "attempt_*"))),
                         ["attempt_0", "attempt_1", "attempt_2"])

    def test_every_restart_runs_the_workers(self):
        # Each attempt must really run the workers: a stale end-of-round event from the previous round must not
        # stop the next one before its workers start (a race, hence several short jobs).
        for job in range(5):
            with self.subTest(job=job):
                attempts = self.path(f"attempts_{job}")
                agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", "--max_restarts", "3",
                                            *self.rank_worker([{"append": attempts, "exit": 6}])], WAIT)
                self.assertEqual(rc, 6, agent.describe())
                with open(attempts) as f:
                    self.assertEqual(f.read(), "".join(f"rank0 attempt{a}\n" for a in range(4)), agent.describe())

    def test_exhausted_restarts_give_the_worker_exit_code(self):
        attempts = self.path("attempts")
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", "--max_restarts", "1",
                                    *self.rank_worker([{"append": attempts, "exit": 5}])], WAIT)
        self.assertEqual(rc, 5, agent.describe())
        with open(attempts) as f:
            self.assertEqual(f.read(), "rank0 attempt0\nrank0 attempt1\n", agent.describe())


class FailureSummary(IntegrationTestCase):
    def test_error_file_message_and_traceback(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", *self.fake("--error-file")], WAIT)
        self.assertEqual(rc, 1, agent.describe())
        err = agent.stderr()
        self.assertIn("Root Cause", err, agent.describe())
        root = err[err.index("Root Cause"):]
        self.assertIn("RuntimeError: fake_worker failed on purpose", root)
        self.assertIn("Traceback (most recent call last):", root)
        self.assertRegex(root, r"error_file: \S*attempt_0/0/error\.json")

    def test_stderr_tail_without_error_file(self):
        # -r 2: stderr goes to stderr.log only; its last lines follow torchrun's block (which says no more than
        # "To enable traceback see: ..." for a worker without an error file).
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", "-r", "2", "--log_dir", self.path("logs"),
                                    *self.fake("--print-lines", "30", "--stderr", "--tag", "ERRLINE", "--exit", "4")],
                                   WAIT)
        self.assertEqual(rc, 4, agent.describe())
        err = agent.stderr()
        self.assertIn("Root Cause", err, agent.describe())
        root = err[err.index("Root Cause"):]
        self.assertIn("  error_file: <N/A>\n  traceback : To enable traceback see: "
                      "https://pytorch.org/docs/stable/elastic/errors.html\n", root)
        details = root[root.index("ddprun: more on these failures:\n[0]: rank 0 (local_rank: 0)\n"):]
        self.assertIn("ERRLINE29:", details)  # the last line the worker wrote
        self.assertNotIn("ERRLINE29:", err[:err.index("Root Cause")])  # not on the console: -r 2


class LogsAndConsole(IntegrationTestCase):
    def output_job(self, stdout_lines=3):
        """Rank lr writes "ERR<lr>\\n" on stderr and OUT<lr>-0: .. on stdout."""
        return self.rank_worker([{"stderr": "ERR${local_rank}\n",
                                  "args": ["--print-lines", str(stdout_lines), "--tag", "OUT${local_rank}-"]}])

    def run_dirs(self, run_id):
        return glob.glob(self.path("logs", f"{run_id}_*"))

    def test_redirects_3_writes_files_and_nothing_to_the_console(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "2", "--log_dir", self.path("logs"),
                                    "--rdzv_id", "redir", "--redirects", "3", *self.output_job()], WAIT)
        self.assertEqual(rc, 0, agent.describe())
        run_dirs = self.run_dirs("redir")
        self.assertEqual(len(run_dirs), 1, run_dirs)
        for lr in range(2):
            d = os.path.join(run_dirs[0], "attempt_0", str(lr))
            with open(os.path.join(d, "stdout.log")) as f:
                self.assertEqual(f.read(), "".join(f"OUT{lr}-{i}:\n" for i in range(3)))
            with open(os.path.join(d, "stderr.log")) as f:
                self.assertEqual(f.read(), f"ERR{lr}\n")
        self.assertNotIn("OUT", agent.stdout())
        self.assertNotIn("ERR", agent.stderr())

    def test_tee_3_prefixes_the_console_and_not_the_files(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "2", "--log_dir", self.path("logs"),
                                    "--rdzv_id", "tee", "--tee", "3", *self.output_job()], WAIT)
        self.assertEqual(rc, 0, agent.describe())
        out_lines = [l for l in agent.stdout().splitlines() if not AGENT_LOG_LINE.match(l)]
        err_lines = [l for l in agent.stderr().splitlines() if "ERR" in l]
        for lr in range(2):
            self.assertEqual([l for l in out_lines if f"OUT{lr}-" in l],
                             [f"[default{lr}]:OUT{lr}-{i}:" for i in range(3)])
            self.assertEqual([l for l in err_lines if f"ERR{lr}" in l], [f"[default{lr}]:ERR{lr}"])
            d = os.path.join(self.run_dirs("tee")[0], "attempt_0", str(lr))
            with open(os.path.join(d, "stdout.log")) as f:
                self.assertEqual(f.read(), "".join(f"OUT{lr}-{i}:\n" for i in range(3)))
            with open(os.path.join(d, "stderr.log")) as f:
                self.assertEqual(f.read(), f"ERR{lr}\n")

    def test_console_lines_stay_whole_under_tee(self):
        nproc, lines, width = 4, 2000, 300
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", str(nproc), "--log_dir", self.path("logs"),
                                    "--rdzv_id", "atomic", "--tee", "1",
                                    *self.fake("--print-lines", lines, "--line-bytes", width,
                                               "--tag", "W${local_rank}-")], WAIT)
        self.assertEqual(rc, 0, agent.describe())
        pattern = re.compile(r"^\[default(\d)\]:W(\d)-(\d+):([a-z]*)$")
        seen = {lr: [] for lr in range(nproc)}
        for line in agent.stdout().split("\n")[:-1]:
            if AGENT_LOG_LINE.match(line):
                continue
            m = pattern.match(line)
            self.assertIsNotNone(m, f"torn or foreign console line: {line[:200]!r}")
            self.assertEqual(m.group(1), m.group(2), f"prefix of another rank: {line[:80]!r}")
            body = f"W{m.group(2)}-{m.group(3)}:"
            self.assertEqual(len(body) + len(m.group(4)), width, f"line of the wrong length: {line[:80]!r}")
            seen[int(m.group(1))].append(int(m.group(3)))
        for lr in range(nproc):
            self.assertEqual(seen[lr], list(range(lines)), f"rank {lr}: lines lost, repeated or reordered")
            with open(os.path.join(self.run_dirs("atomic")[0], "attempt_0", str(lr), "stdout.log")) as f:
                self.assertEqual(f.read().count("\n"), lines)

    def test_local_ranks_filter_shows_only_rank_0(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "3", "--local_ranks_filter", "0",
                                    *self.output_job()], WAIT)
        self.assertEqual(rc, 0, agent.describe())
        out = agent.stdout()
        self.assertIn("OUT0-2:", out, agent.describe())
        self.assertNotIn("OUT1", out)
        self.assertNotIn("OUT2", out)
        self.assertIn("ERR0", agent.stderr())
        self.assertNotIn("ERR1", agent.stderr())


class DryRunAndErrors(IntegrationTestCase):
    def test_dry_run_prints_the_plan_and_starts_nothing(self):
        agent, rc = self.run_agent(["--nproc_per_node", "2", "--dry-run",
                                    *self.fake("--pidfile", self.path("pid_${local_rank}"))], WAIT)
        self.assertEqual(rc, 0, agent.describe())
        out = agent.stdout()
        self.assertIn(FAKE_WORKER, out)
        self.assertIn(self.path("pid_1"), out)  # argv shown with ${local_rank} substituted
        self.assertIn("WORLD_SIZE=2", out)
        self.assertEqual(glob.glob(self.path("pid_*")), [])
        self.assertEqual(self.live_processes(), [])

    def test_bad_command_lines_exit_2_and_name_the_flag(self):
        worker = self.fake("--pidfile", self.path("pid_${local_rank}"))
        cases = [
            (["--nnodes", "0", *worker], "--nnodes"),
            (["--nnodes", "3:2", *worker], "--nnodes"),
            (["--master_port", "abc", *worker], "--master_port"),
            (["--rdzv_conf", "join_timeout=soon", *worker], "join_timeout"),
            (["--nproc_per_node", "2"], "training script"),
        ]
        for args, needle in cases:
            with self.subTest(args=args[:2]):
                agent, rc = self.run_agent(args, WAIT)
                self.assertEqual(rc, 2, agent.describe())
                self.assertIn(needle, agent.stderr())
                self.assertIn("ddprun: ", agent.stderr())
                self.assertEqual(glob.glob(self.path("pid_*")), [])
        self.assertEqual(self.live_processes(), [])

    def test_port_in_use_exits_3_and_names_the_port(self):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
            blocker.bind(("127.0.0.1", 0))
            blocker.listen()
            port = blocker.getsockname()[1]
            agent, rc = self.run_agent(["--nnodes", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                                        *self.fake("--pidfile", self.path("pid_${local_rank}"))], WAIT)
        self.assertEqual(rc, 3, agent.describe())
        self.assertRegex(agent.output(), rf"(127\.0\.0\.1|0\.0\.0\.0|\[::\]|localhost):{port}\b")
        self.assertEqual(glob.glob(self.path("pid_*")), [])

    def test_missing_program_or_script_is_refused_before_the_rendezvous(self):
        # Node 1 of 2 with nobody else coming: a rendezvous would wait for its join timeout; the preflight
        # refuses at once (exit 2).
        missing = self.path("no-such-program")
        lonely = ["--nnodes", "2", "--node_rank", "1", "--master_port", str(free_port()), "--nproc_per_node", "2"]
        for args, named in (([*lonely, "--no_python", missing], missing),
                            ([*lonely, "--python", PYTHON, self.path("no_such_script.py")], "no_such_script.py"),
                            ([*lonely, "--python", self.path("no-python"), "-m", "json.tool"], "no-python")):
            with self.subTest(named=named):
                agent, rc = self.run_agent(args, 30)
                self.assertEqual(rc, 2, agent.describe())
                self.assertIn(named, agent.output())
                self.assertRegex(agent.output(), r"No such file|not found")
                self.assertNotIn("rendezvous", agent.output())
                self.assertEqual(self.live_processes(), [])

    def test_static_single_node_with_free_port(self):
        port = free_port()
        agent, rc = self.run_agent(["--nnodes", "1", "--master_port", str(port), "--nproc_per_node", "2",
                                    *self.fake("--dump-env", self.path("env_${local_rank}.json"))], WAIT)
        self.assertEqual(rc, 0, agent.describe())
        self.assertEqual(read_json_file(self.path("env_1.json"))["MASTER_PORT"], str(port))

    def test_a_watchdog_that_cannot_be_set_up_names_its_cause_in_the_error_file(self):
        # torch's FileTimer on a path that is a plain file: the agent exits 5 before starting a worker, and the
        # agent's error file (TORCHELASTIC_ERROR_FILE) and event log give the FileTimer's own error, not a
        # log-directory one.
        not_a_fifo = self.path("timer")
        with open(not_a_fifo, "w") as f:
            f.write("a plain file\n")
        error_file = self.path("agent_error.json")
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1", "--log_dir", self.path("logs"),
                                    "--event_log_handler", "console",
                                    *self.fake("--pidfile", self.path("pid_${local_rank}"))], WAIT,
                                   env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1", "TORCHELASTIC_TIMER_FILE": not_a_fifo,
                                        "TORCHELASTIC_ERROR_FILE": error_file, "LOGLEVEL": "INFO"})
        self.assertEqual(rc, 5, agent.describe())
        message = read_json_file(error_file)["message"]["message"]
        self.assertIn("watchdog", message)
        self.assertIn(f"{not_a_fifo} exists and is not a FIFO", message)
        self.assertNotIn("log directory", message)
        failed = [line for line in agent.stderr().splitlines() if '"FAILED"' in line]
        self.assertTrue(any("is not a FIFO" in line for line in failed), agent.describe())
        self.assertEqual(glob.glob(self.path("pid_*")), [])
        self.assertEqual(self.live_processes(), [])

    def test_static_timeout_key_bounds_the_wait_for_the_store(self):
        # torchrun's static backend reads rdzv_conf "timeout" as its store timeout: node 1 of 2 whose master
        # never comes up must give up after about that long, exit 4 and name the endpoint.
        port = free_port()
        start = time.monotonic()
        agent, rc = self.run_agent(["--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1",
                                    "--master_port", str(port), "--rdzv_conf", "timeout=3",
                                    *self.fake("--pidfile", self.path("pid_${local_rank}"))], WAIT)
        elapsed = time.monotonic() - start
        self.assertEqual(rc, 4, agent.describe())
        self.assertIn(f"127.0.0.1:{port}", agent.output())
        self.assertLess(elapsed, 3 + 20, agent.describe())
        self.assertEqual(glob.glob(self.path("pid_*")), [])


if __name__ == "__main__":
    unittest.main()
