"""Signals to ddprun and what happens to its workers: forwarding, exit codes, the SIGKILL after
--shutdown_timeout, process groups, and no orphans when the agent itself is SIGKILLed. Fake workers only."""
import os
import pty
import re
import shutil
import signal
import subprocess
import threading
import unittest

from ddprun_testlib import DDPRUN, HOST_PYTHON, IntegrationTestCase, proc_stat, wait_until

WAIT = 60  # seconds: bound for anything that should take well under a second


class Signals(IntegrationTestCase):
    def start_recording_workers(self, nproc, extra_args=()):
        """nproc workers that record the signals they get and hang; returns (agent, worker pids)."""
        agent = self.start(["--standalone", "--nproc_per_node", str(nproc), *extra_args,
                            *self.fake("--record-signals", self.path("signals_${local_rank}"),
                                       "--pidfile", self.path("pid_${local_rank}"), "--hang")])
        return agent, self.wait_pidfiles(self.path("pid_{}"), nproc, WAIT)

    def recorded(self, nproc):
        out = []
        for lr in range(nproc):
            with open(self.path(f"signals_{lr}")) as f:
                out.append(f.read().split())
        return out

    def check_forwarded(self, sig, extra_args=()):
        agent, pids = self.start_recording_workers(3, extra_args)
        agent.signal(sig)
        self.assertEqual(agent.wait(WAIT), 128 + sig, agent.describe())
        name = signal.Signals(sig).name[3:]
        self.assertEqual(self.recorded(3), [["ready", name]] * 3, agent.describe())
        self.assert_gone(pids, WAIT, "workers after ddprun exited")

    def test_sigterm_is_forwarded_and_exits_143(self):
        self.check_forwarded(signal.SIGTERM)

    def test_sigint_is_forwarded_and_exits_130(self):
        self.check_forwarded(signal.SIGINT)

    def test_sigusr1_is_forwarded_when_handled(self):
        self.check_forwarded(signal.SIGUSR1, ["--signals_to_handle", "SIGTERM,SIGUSR1"])

    def test_worker_ignoring_sigterm_is_killed_after_shutdown_timeout(self):
        agent = self.start(["--standalone", "--nproc_per_node", "2", "--shutdown_timeout", "1",
                            *self.fake("--ignore-sigterm", "--pidfile", self.path("pid_${local_rank}"), "--hang")])
        pids = self.wait_pidfiles(self.path("pid_{}"), 2, WAIT)
        agent.signal(signal.SIGTERM)
        # The default grace is 30 s; ddprun must use the 1 s given (the bound leaves room for a slow machine).
        self.assertEqual(agent.wait(20), 143, agent.describe())
        self.assert_gone(pids, WAIT, "workers that ignored SIGTERM")

    def test_each_worker_leads_its_own_process_group(self):
        agent, pids = self.start_recording_workers(3)
        agent_pgrp = proc_stat(agent.pid)[2]
        for pid in pids:
            st = proc_stat(pid)
            self.assertIsNotNone(st, f"worker {pid} vanished")
            self.assertEqual(st[2], pid, f"worker {pid}: pgid {st[2]}")
            self.assertNotEqual(st[2], agent_pgrp)
        agent.signal(signal.SIGTERM)
        self.assertEqual(agent.wait(WAIT), 143, agent.describe())


class Orphans(IntegrationTestCase):
    def start_with_grandchildren(self, nproc):
        """Workers that each fork a grandchild ignoring TERM/INT/HUP; returns (agent, workers, grandchildren)."""
        agent = self.start(["--standalone", "--nproc_per_node", str(nproc),
                            *self.fake("--spawn-grandchild", "--pidfile", self.path("pid_${local_rank}"), "--hang")])
        workers = self.wait_pidfiles(self.path("pid_{}"), nproc, WAIT)

        def announced():
            pids = [int(p) for p in re.findall(r"^grandchild (\d+)$", agent.stdout(), re.M)]
            return pids if len(pids) == nproc else None

        return agent, workers, wait_until(announced, WAIT, "grandchild pids on ddprun's stdout")

    def test_sigkilled_agent_leaves_no_worker(self):
        self.allow_leftovers = True  # the assertion below reports survivors itself
        agent, workers, _ = self.start_with_grandchildren(2)
        agent.signal(signal.SIGKILL)
        self.assertEqual(agent.wait(WAIT, drain=False), -signal.SIGKILL)
        self.assert_gone(workers, 10, "workers of a SIGKILLed ddprun")

    # PR_SET_PDEATHSIG kills the workers, but a grandchild (re-parented to init, ignoring SIGTERM) would have
    # nobody left to kill it once the agent is SIGKILLed: ddprun's orphan guard process (agent/process/orphan_guard.h)
    # SIGKILLs the workers' groups when the agent vanishes. torchrun leaves such grandchildren running.
    def test_sigkilled_agent_leaves_no_grandchild(self):
        agent, workers, grandchildren = self.start_with_grandchildren(2)
        agent.signal(signal.SIGKILL)
        self.assertEqual(agent.wait(WAIT, drain=False), -signal.SIGKILL)
        self.assert_gone(workers + grandchildren, 10, "workers and grandchildren of a SIGKILLed ddprun")

    def test_sigterm_also_ends_grandchildren(self):
        agent, workers, grandchildren = self.start_with_grandchildren(2)
        agent.signal(signal.SIGTERM)
        self.assertEqual(agent.wait(WAIT), 143, agent.describe())
        # The worker dies of SIGTERM; its grandchild ignores it and must be SIGKILLed with the group.
        self.assert_gone(workers + grandchildren, 10, "workers and grandchildren after SIGTERM")

    def test_failed_worker_takes_its_grandchild_along(self):
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "1",
                                    *self.fake("--spawn-grandchild", "--exit", "9")], WAIT)
        self.assertEqual(rc, 9, agent.describe())
        grandchildren = [int(p) for p in re.findall(r"^grandchild (\d+)$", agent.stdout(), re.M)]
        self.assertEqual(len(grandchildren), 1, agent.describe())
        self.assert_gone(grandchildren, 10, "grandchild of a failed worker")


# A worker that leaves two processes outside its process group, each running `sleep` with the test's token
# in argv: a child that calls setsid(), and a daemon (fork, setsid, fork, the middle one exits). Writes
# their pids to <dir>/escaped_<local_rank>, then its own to <dir>/pid_<local_rank>; then sleeps ("hang"), or
# exits 0 ("exit") once <dir>/release exists: the test creates it after it has seen the escaped processes
# alive (an earlier exit let the agent's end-of-run sweep kill them before the test looked: "vanished early").
# Usage: escaping_worker.py DIR TOKEN exit|hang
ESCAPING_WORKER = r"""
import os, sys, time
out, token, then = sys.argv[1], sys.argv[2], sys.argv[3]
rank = os.environ["LOCAL_RANK"]
sleeper = ["/bin/sh", "-c", "exec sleep 1000", "escaped-" + token]
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    os.write(w, b"%d\n" % os.getpid())
    os.execv(sleeper[0], sleeper)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, b"%d\n" % os.getpid())
        os.execv(sleeper[0], sleeper)
    os._exit(0)
data = b""
while data.count(b"\n") < 2:
    data += os.read(r, 64)
pids = [int(p) for p in data.split()]
with open(os.path.join(out, "escaped_" + rank), "w") as f:
    f.write(" ".join(map(str, pids)))
with open(os.path.join(out, "pid_" + rank), "w") as f:
    f.write("%d\n" % os.getpid())
if then == "hang":
    while True:
        time.sleep(1000)
while not os.path.exists(os.path.join(out, "release")):
    time.sleep(0.005)
"""


def guard_of(agent_pid):
    """The pid of the agent's child named ddprun-guard, or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = proc_stat(entry)
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if st and st[1] == agent_pid and comm == "ddprun-guard" and st[0] not in ("Z", "X"):
            return int(entry)
    return None


class EscapedDescendants(IntegrationTestCase):
    """Descendants that left the worker's session and process group (setsid, a daemon's double fork) end
    with the agent: its cgroup (cgroup.kill) or, without one, its subreaper sweep (agent/process/orphan_guard.h)."""

    def start_escaping(self, then, nproc=1, wrap=()):
        """ddprun (run through `wrap`, a command ending in the ddprun binary, when given) with nproc
        ESCAPING_WORKERs; returns (agent, the escaped pids) once all are running."""
        script = self.path("escaping_worker.py")
        with open(script, "w") as f:
            f.write(ESCAPING_WORKER)
        args = ["--standalone", "--nproc_per_node", str(nproc), "--no_python", HOST_PYTHON, script, self.tmp,
                self.token, then]
        agent = self.start([*wrap[1:], *args], program=wrap[0] if wrap else None)
        workers = self.wait_pidfiles(self.path("pid_{}"), nproc, WAIT)
        escaped = []
        for lr in range(nproc):
            with open(self.path(f"escaped_{lr}")) as f:
                escaped += [int(p) for p in f.read().split()]
        for pid in escaped:
            st = proc_stat(pid)
            self.assertIsNotNone(st, f"escaped process {pid} vanished early")
            self.assertNotIn(st[2], workers, f"process {pid} should have left its worker's group: {st}")
        with open(self.path("release"), "w"):
            pass  # "exit" workers may end now
        return agent, escaped

    def marked(self):
        """Live processes with the test's token in argv."""
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except (OSError, ValueError):
                continue
            if f"escaped-{self.token}".encode() in argv and proc_stat(entry) and proc_stat(entry)[0] != "Z":
                found.append(int(entry))
        return found

    def assert_nothing_left(self, escaped, what):
        self.assert_gone(escaped, 10, what)
        self.assertEqual(self.marked(), [], what)
        self.assertEqual(self.live_processes(), [], what)

    def test_normal_exit_ends_escaped_descendants(self):
        agent, escaped = self.start_escaping("exit", nproc=2)
        self.assertEqual(agent.wait(WAIT), 0, agent.describe())
        self.assert_nothing_left(escaped, "setsid child and daemon after ddprun exited 0")

    def test_sigterm_ends_escaped_descendants(self):
        agent, escaped = self.start_escaping("hang")
        agent.signal(signal.SIGTERM)
        self.assertEqual(agent.wait(WAIT), 143, agent.describe())
        self.assert_nothing_left(escaped, "setsid child and daemon after SIGTERM to ddprun")

    def test_sigkilled_agent_ends_escaped_descendants(self):
        agent, escaped = self.start_escaping("hang")
        guard = guard_of(agent.proc.pid)
        agent.signal(signal.SIGKILL)
        self.assertEqual(agent.wait(WAIT, drain=False), -signal.SIGKILL)
        self.assert_nothing_left(escaped, "setsid child and daemon of a SIGKILLed ddprun")
        self.assert_gone([guard], 10, "the orphan guard once it has cleaned up")

    def test_guard_is_named_and_restarted(self):
        agent, escaped = self.start_escaping("hang")
        guard = wait_until(lambda: guard_of(agent.proc.pid), WAIT, "the orphan guard")
        with open(f"/proc/{guard}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        self.assertEqual(argv[0], b"ddprun-guard", argv)
        self.assertNotIn(self.token.encode(), b" ".join(argv))  # pgrep -f SCRIPT, kill loops miss it
        with open(f"/proc/{guard}/environ", "rb") as f:
            self.assertEqual(f.read(), b"")
        os.kill(guard, signal.SIGKILL)
        replacement = wait_until(lambda: (g := guard_of(agent.proc.pid)) != guard and g, WAIT,
                                 "a new orphan guard")
        agent.signal(signal.SIGKILL)
        self.assertEqual(agent.wait(WAIT, drain=False), -signal.SIGKILL)
        self.assert_nothing_left(escaped, "setsid child and daemon: guard killed, then ddprun SIGKILLed")
        self.assert_gone([replacement], 10, "the replacement guard once it has cleaned up")

    # Without a writable cgroup (an ordinary user session, a container's read-only /sys/fs/cgroup), ddprun is a
    # child subreaper: the daemon is re-parented to ddprun, and its end-of-run sweep finds it.
    def test_without_cgroup_normal_exit_ends_escaped_descendants(self):
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            self.skipTest("needs root and unshare(1) to hide the cgroup hierarchy")
        ro_cgroup = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                     "mount -o remount,bind,ro /sys/fs/cgroup/unified 2>/dev/null; "
                     "mount -o remount,bind,ro /sys/fs/cgroup 2>/dev/null; exec \"$0\" \"$@\""]
        agent, escaped = self.start_escaping("exit", wrap=(*ro_cgroup, os.environ["DDPRUN"]))
        self.assertEqual(agent.wait(WAIT), 0, agent.describe())
        self.assert_nothing_left(escaped, "setsid child and daemon after ddprun exited 0 (no cgroup)")


class PtyAgent:
    """ddprun run as from a shell in a terminal: a pseudo-terminal is its controlling terminal, stdin, stdout
    and stderr, and its process group is the terminal's foreground (setsid --ctty). type() writes to the
    terminal as a keyboard would (b"\\x03" is Ctrl-C); output() is everything shown on it."""

    def __init__(self, args, env, cwd):
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(["setsid", "--ctty", DDPRUN, *args], stdin=slave, stdout=slave, stderr=slave,
                                     env=env, cwd=cwd)
        os.close(slave)
        self.master = master
        self._chunks = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                return
            if not chunk:
                return
            with self._lock:
                self._chunks.append(chunk)

    def output(self):
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")

    def type(self, data):
        os.write(self.master, data)

    def wait_for(self, text, timeout):
        wait_until(lambda: text in self.output(), timeout, repr(text) + " on the terminal",
                   lambda: "--- terminal ---\n" + self.output()[-3000:])

    def wait(self, timeout):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ddprun still running after {timeout} s\n--- terminal ---\n"
                                 f"{self.output()[-3000:]}") from None
        self._reader.join(10)
        return rc

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)
        os.close(self.master)


class TerminalInput(IntegrationTestCase):
    """Terminal input as under torchrun (agent/process/terminal.h): local rank 0 holds the terminal (its process group
    is the foreground) and reads what is typed; the other local ranks read end of file; Ctrl-C reaches rank 0
    and interrupts the job; a worker stopped by the terminal is reported, not waited for in silence."""

    def setUp(self):
        super().setUp()
        if shutil.which("setsid") is None:
            self.skipTest("needs setsid(1) from util-linux")

    def start_in_terminal(self, nproc, script):
        path = self.path("worker.py")
        with open(path, "w") as f:
            f.write(script)
        env = dict(os.environ, DDPRUN_IT_TOKEN=self.token)
        env.pop("PYTHONBREAKPOINT", None)
        agent = PtyAgent(["--standalone", "--nproc_per_node", str(nproc), "--python", HOST_PYTHON, path], env,
                         self.tmp)
        self.addCleanup(agent.close)
        return agent

    def test_rank_0_reads_the_line_typed(self):
        agent = self.start_in_terminal(1, "line = input('type here> ')\nprint('rank 0 got ' + line.upper())\n")
        agent.wait_for("type here> ", WAIT)
        agent.type(b"hello\n")
        self.assertEqual(agent.wait(WAIT), 0, agent.output())
        self.assertIn("rank 0 got HELLO", agent.output())

    def test_breakpoint_in_rank_0(self):
        agent = self.start_in_terminal(1, "x = 6\nbreakpoint()\nprint('after the breakpoint')\n")
        agent.wait_for("(Pdb) ", WAIT)
        agent.type(b"p x*7\n")
        agent.wait_for("42", WAIT)
        agent.type(b"c\n")
        self.assertEqual(agent.wait(WAIT), 0, agent.output())
        self.assertIn("after the breakpoint", agent.output())

    def test_other_ranks_read_end_of_file(self):
        agent = self.start_in_terminal(2, "import os, sys\nif os.environ['LOCAL_RANK'] == '1':\n"
                                          "    print('rank 1 read %r' % sys.stdin.read())\n")
        self.assertEqual(agent.wait(WAIT), 0, agent.output())
        self.assertIn("rank 1 read ''", agent.output())

    def test_worker_stopped_by_the_terminal_is_reported_and_ctrl_c_ends_the_job(self):
        agent = self.start_in_terminal(2, "import os, time\n"
                                          "open(os.path.join(os.path.dirname(__file__), 'pid_' + os.environ['LOCAL_RANK']), "
                                          "'w').write('%d\\n' % os.getpid())\n"
                                          "if os.environ['LOCAL_RANK'] == '1':\n    open('/dev/tty').read()\n"
                                          "time.sleep(1000)\n")
        pids = self.wait_pidfiles(self.path("pid_{}"), 2, WAIT)
        line = f"local_rank 1 (pid {pids[1]}) is stopped by SIGTTIN: it read the terminal, which only local_rank 0"
        agent.wait_for(line, WAIT)
        self.assertEqual(proc_stat(pids[1])[0], "T")
        agent.type(b"\x03")
        self.assertEqual(agent.wait(WAIT), 130, agent.output())
        self.assertEqual(agent.output().count(line), 1, agent.output())
        self.assert_gone(pids, WAIT, "workers after Ctrl-C")

    def test_ctrl_c_reaches_rank_0_and_interrupts_the_job(self):
        agent = self.start_in_terminal(2, "import os, time\n"
                                          "open(os.path.join(os.path.dirname(__file__), 'pid_' + os.environ['LOCAL_RANK']), "
                                          "'w').write('%d\\n' % os.getpid())\ntime.sleep(1000)\n")
        pids = self.wait_pidfiles(self.path("pid_{}"), 2, WAIT)
        self.assertEqual(os.tcgetpgrp(agent.master), pids[0], "rank 0's group holds the terminal")
        agent.type(b"\x03")
        self.assertEqual(agent.wait(WAIT), 130, agent.output())
        self.assertIn("which holds the terminal, ended by SIGINT: interrupting the job", agent.output())
        self.assertNotIn("received SIGINT", agent.output())  # the agent itself did not get it
        self.assertNotIn("restarting", agent.output())
        self.assert_gone(pids, WAIT, "workers after Ctrl-C")

    def test_without_a_terminal_every_rank_inherits_stdin(self):
        script = self.path("worker.py")
        with open(script, "w") as f:
            f.write("import os, sys\nif os.environ['LOCAL_RANK'] == '1':\n    print('rank 1 read %r' % sys.stdin.read())\n")
        done = subprocess.run([DDPRUN, "--standalone", "--nproc_per_node", "2", "--python", HOST_PYTHON, script],
                              input=b"from a pipe\n", capture_output=True, timeout=WAIT, cwd=self.tmp,
                              env=dict(os.environ, DDPRUN_IT_TOKEN=self.token), start_new_session=True)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn(b"rank 1 read 'from a pipe\\n'", done.stdout)

    def test_a_worker_that_stops_itself_is_reported_once(self):
        agent = self.start(["--standalone", "--nproc_per_node", "1", "--no_python", HOST_PYTHON, "-c",
                            "import os, signal\nopen('pid_0', 'w').write('%d\\n' % os.getpid())\n"
                            "os.kill(os.getpid(), signal.SIGTTOU)\n"])
        pid = self.wait_pidfiles(self.path("pid_{}"), 1, WAIT)[0]
        line = f"local_rank 0 (pid {pid}) is stopped by SIGTTOU"
        wait_until(lambda: line in agent.output(), WAIT, "the stop reported", agent.describe)
        # Resumed from outside, it goes on and the job succeeds; the stop was reported once.
        os.kill(pid, signal.SIGCONT)
        self.assertEqual(agent.wait(WAIT), 0, agent.describe())
        self.assertEqual(agent.output().count(line), 1, agent.describe())


if __name__ == "__main__":
    unittest.main()
