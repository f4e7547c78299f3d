"""`ddprun status` on real hosts (network namespaces, tests/integration/netns_hosts.py): a c10d job of 2 hosts x 2
real gloo DDP ranks (scripts/examples/ddp_train.py) is read from a third host, where no agent runs:
  - while it trains: state running, 2 nodes, 4 ranks, no restart; the table shows the same;
  - after a crash (rank 0 exits once) and the restart: restarts used 1, the node whose worker failed caused it,
    and the node ranks kept;
  - `--watch` under tmux redraws the table (tmux capture-pane);
  - a run id the store does not know: exit 4 naming it; an endpoint nobody serves: exit 3 naming it.
"""
import json
import os
import subprocess
import time
import unittest

from netns_hosts import CLUSTER, DDPRUN, NPROC, HostsTestCase, address, wait_until

PORT = 29421


class StatusOnHosts(HostsTestCase):
    def status(self, *args, run_id=None):
        """`ddprun status` run on host 3: (exit code, stdout, stderr)."""
        argv = ["bash", CLUSTER, "exec", "3", DDPRUN, "status", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                f"{address(1)}:{PORT}", "--rdzv_id", run_id or self.run_id, *args]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr

    def json_status(self):
        rc, out, err = self.status("--json")
        self.assertEqual(rc, 0, err)
        return json.loads(out)

    def test_status_from_another_host_during_a_job_and_after_a_crash(self):
        crash = ("--fail-rank", "0", "--fail-file", self.path("crash"))
        agents = [self.start_training(h, PORT, steps=4000, nnodes="2", extra=crash) for h in (1, 2)]
        self.wait_for_training(agents, nodes=2)

        s = wait_until(lambda: (lambda j: j if j["state"] == "running" and len(j["ranks"]) == 2 * NPROC else None)(
            self.json_status()), 30, "status: running with 4 ranks", self.describe_all)
        self.assertEqual(s["run_id"], self.run_id)
        self.assertEqual(len(s["nodes"]), 2, s)
        self.assertEqual(s["restarts"], {"used": 0, "max": 3}, s)
        self.assertEqual(sorted(n["node_rank"] for n in s["nodes"]), [0, 1], s)
        self.assertEqual([r["rank"] for r in s["ranks"]], list(range(2 * NPROC)), s)
        self.assertTrue(all(r["state"] == "running" and r["pid"] > 0 for r in s["ranks"]), s)
        self.assertTrue(all(n["heartbeat_age_s"] < 30 for n in s["nodes"]), s)
        before = {n["host"]: n["node_rank"] for n in s["nodes"]}
        rc, table, err = self.status()
        self.assertEqual(rc, 0, err)
        self.assertIn(f"job {self.run_id} at {address(1)}:{PORT}: running", table)
        self.assertIn("RANK", table)

        with open(self.path("crash"), "w"):
            pass
        s = wait_until(lambda: (lambda j: j if j["state"] == "running" and j["restarts"]["used"] == 1
                                and len(j["ranks"]) == 2 * NPROC else None)(self.json_status()),
                       90, "status: running again after one restart", self.describe_all)
        self.assertEqual(s["round"], 1, s)
        self.assertEqual({n["host"]: n["node_rank"] for n in s["nodes"]}, before, s)
        self.assertEqual(sorted(n["restarts_caused"] for n in s["nodes"]), [0, 1], s)

        # --watch redraws in place until Ctrl-C (tmux: a terminal of its own).
        session = f"ddprun-status-{os.getpid()}"
        watch = " ".join(["bash", CLUSTER, "exec", "3", DDPRUN, "status", "--rdzv_backend", "c10d",
                          "--rdzv_endpoint", f"{address(1)}:{PORT}", "--rdzv_id", self.run_id, "--watch"])
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", watch], check=True)
        try:
            def screen():
                return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                      text=True).stdout
            wait_until(lambda: "RANK" in screen() and "running" in screen(), 30, "the table under tmux",
                       lambda: screen())
            first = screen()
            time.sleep(2.5)
            # Redrawn in place: one table on the screen, its heartbeat ages changed.
            self.assertEqual(screen().count("RANK"), 1, screen())
            self.assertNotEqual(screen(), first)
            subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
            wait_until(lambda: subprocess.run(["tmux", "has-session", "-t", session],
                                              capture_output=True).returncode != 0, 10, "--watch to exit on Ctrl-C")
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)

        rc, out, err = self.status(run_id="no-such-job")
        self.assertEqual(rc, 4, out + err)
        self.assertIn("no-such-job", err)
        self.stop_training()
        self.assert_exit_zero(agents)
        rc, out, err = self.status()  # the store left with the job
        self.assertEqual(rc, 3, out + err)
        self.assertIn(f"{address(1)}:{PORT}", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
