"""`ddprun status` and the agents' metrics on real hosts (network namespaces, tests/integration/netns_hosts.py): a
c10d job of 2 hosts x 2 ranks (the light worker, light_train.py: what is shown is the agents' doing), every agent
with --metrics_port, is watched from a third host, where no agent runs:
  - a real Prometheus on host 3 scrapes both agents; after the crash below its HTTP API reports
    ddprun_restarts_total 1; `promtool check metrics` accepts an agent's /metrics; /healthz and /readyz answer
    200 while the job trains;
  - while it trains: state running, 2 nodes, 4 ranks, no restart; the table shows the same;
  - after a crash (rank 0 exits once) and the restart: restarts used 1, the node whose worker failed caused it,
    and the node ranks kept;
  - `--watch` under tmux redraws the table (tmux capture-pane);
  - a run id the store does not know: exit 4 naming it; an endpoint nobody serves: exit 3 naming it;
  - a stranger on host 3 writes a malformed status document into the open store (the current round, one
    plausible rank entry, a number as host): the job trains on to the end, `ddprun status` shows the job
    and lists what it skipped.
"""
import json
import os
import shutil
import subprocess
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from netns_hosts import CLUSTER, DDPRUN, NPROC, HostsTestCase, address, wait_until

PORT = 29421
METRICS = 29431
PROMETHEUS = f"{address(3)}:9090"


class StatusOnHosts(HostsTestCase):
    def status(self, *args, run_id=None):
        """`ddprun status` run on host 3: (exit code, stdout, stderr)."""
        argv = ["bash", CLUSTER, "exec", "3", DDPRUN, "status", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                f"{address(1)}:{PORT}", "--rdzv_id", run_id or self.run_id, *args]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr

    def http(self, url):
        """(status, body) of a GET from this (the root) namespace, which reaches the hosts over the bridge."""
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def start_prometheus(self):
        """Prometheus on host 3, scraping both agents every second; stopped at the test's end."""
        config = self.path("prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                    "  - job_name: ddprun\n    static_configs:\n"
                    f"      - targets: ['{address(1)}:{METRICS}', '{address(2)}:{METRICS}']\n")
        log = open(self.path("prometheus.log"), "wb")
        proc = subprocess.Popen(["bash", CLUSTER, "exec", "3", shutil.which("prometheus"), f"--config.file={config}",
                                 f"--storage.tsdb.path={self.path('tsdb')}", f"--web.listen-address={PROMETHEUS}"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        return proc

    def prometheus_value(self, query):
        """The value of an instant PromQL query (one series), or None."""
        status, body = self.http(f"http://{PROMETHEUS}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
        if status != 200:
            return None
        result = json.loads(body)["data"]["result"]
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def json_status(self):
        rc, out, err = self.status("--json")
        self.assertEqual(rc, 0, err)
        return json.loads(out)

    def test_status_from_another_host_during_a_job_and_after_a_crash(self):
        crash = ("--fail-rank", "0", "--fail-file", self.path("crash"))
        agents = [self.start_training(h, PORT, steps=4000, nnodes="2", extra=crash,
                                      agent_args=("--metrics_port", str(METRICS))) for h in (1, 2)]
        self.start_prometheus()
        self.wait_for_training(agents, nodes=2)
        for h in (1, 2):
            self.assertEqual(self.http(f"http://{address(h)}:{METRICS}/healthz")[0], 200)
            self.assertEqual(self.http(f"http://{address(h)}:{METRICS}/readyz")[0], 200)
        status, text = self.http(f"http://{address(1)}:{METRICS}/metrics")
        self.assertEqual(status, 200)
        self.assertIn('ddprun_workers{state="running"} 2', text)
        self.assertIn("ddprun_store_connections", text)  # host 1 hosts the store
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr + text)
        wait_until(lambda: self.prometheus_value("count(up == 1)") == 2, 60, "Prometheus to scrape both agents",
                   lambda: open(self.path("prometheus.log"), errors="replace").read()[-3000:])
        self.assertEqual(self.prometheus_value("max(ddprun_restarts_total)"), 0)

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
        # Both agents counted the restart; Prometheus saw it.
        wait_until(lambda: self.prometheus_value("min(ddprun_restarts_total)") == 1, 30,
                   "Prometheus: ddprun_restarts_total 1 on both agents")
        self.assertEqual(self.prometheus_value('sum(ddprun_rounds_total{reason="failure"})'), 2)

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
            # Redrawn in place: one table on the screen, read at a later second.
            self.assertEqual(sum(line.startswith("RANK ") for line in screen().splitlines()), 1, screen())
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

    def test_a_strangers_status_document_neither_stops_the_job_nor_hides_it(self):
        crash = ("--fail-rank", "0", "--fail-file", self.path("crash"))
        agents = [self.start_training(h, PORT, steps=4000, nnodes="2", extra=crash) for h in (1, 2)]
        self.wait_for_training(agents, nodes=2)
        # Anyone who reaches an open store (the default) can do this; torch's own client, from host 3. The
        # document names round 1, the round the crash below starts: node rank 0 reads the status index again
        # for a new round, and then every document in it.
        doc = json.dumps({"v": 1, "host": 42, "state": "running", "round": 1, "node_rank": "zero",
                          "ranks": [{"rank": 9, "step": 7, "before_collective_s": 5.0, "pid": "x"}, "junk"]})
        write = (f"import datetime, torch.distributed as d\n"
                 f"s = d.TCPStore('{address(1)}', {PORT}, is_master=False, wait_for_workers=False,"
                 f" timeout=datetime.timedelta(seconds=30))\n"
                 f"k = 'ddprun/{self.run_id}/status/'\n"
                 f"s.set(k + 'stranger:1', {doc!r})\n"
                 f"s.set(k + str(s.add(k + 'n', 1) - 1), 'stranger:1')\n"
                 f"s.set(k + 'stragglers', '{{\"round\": \"zero\", \"ranks\": 7}}')\n")
        done = subprocess.run(["bash", CLUSTER, "exec", "3", "/usr/bin/python3", "-c", write],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        with open(self.path("crash"), "w"):
            pass
        def job_ranks(j):
            return sorted(r["rank"] for r in j["ranks"] if r["host"])  # the stranger's rank has no host

        s = wait_until(lambda: (lambda j: j if j["round"] == 1 and job_ranks(j) == list(range(2 * NPROC))
                                and j["skipped"] else None)(self.json_status()), 90,
                       "status: the job's 4 ranks in round 1, the stranger's document skipped in part",
                       self.describe_all)
        self.assertEqual(s["state"], "running", s)
        self.assertEqual(len(s["nodes"]), 3, s)
        self.assertTrue(any("stranger:1" in line and '"host" is not a string' in line for line in s["skipped"]), s)
        rc, table, err = self.status()
        self.assertEqual(rc, 0, err)
        self.assertIn("skipped, unreadable in the agents' documents", table)
        # Node rank 0 reads every document for its straggler report every 4 s; it says once what it skipped.
        wait_until(lambda: any("could not be read and were skipped" in a.log() for a in agents), 30,
                   "node rank 0's agent to say what it skipped", self.describe_all)
        self.stop_training()
        self.assert_exit_zero(agents)
        for agent in agents:
            self.assertNotIn("internal error", agent.log(), agent.describe())
        self.assert_results(2 * NPROC)

if __name__ == "__main__":
    unittest.main(verbosity=2)
