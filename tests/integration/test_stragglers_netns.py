"""The job-wide straggler report on real hosts (network namespaces, tests/integration/netns_hosts.py): a c10d
job of 2 hosts x 2 ranks that write each step's time before the first collective to $DDPRUN_PROGRESS_FILE, every
rank loading each batch for 0.05 s:
  - rank 3 loads 0.15 s longer: the agent of node rank 0 names it — one log line with `straggler` and `rank 3`,
    one `straggler` event in its --event_log_handler file, ddprun_straggler{rank="3"} on its /metrics — and
    `ddprun status --json` from a third host shows it with straggler true, every other rank false; the job
    then finishes with identical parameters, exit 0, no restart;
  - a healthy job of the same shape names nobody over 8 samples (the rule's window is 5 samples of 4 s): no log
    line, no event, no series, straggler false for all. DDPRUN_IT_REPEAT=N runs it N times.
Workers: real gloo DDP ranks (scripts/examples/ddp_train.py, whose DDP communication hook notes the time) with
every torch version for the healthy job - that the hook measures what it should in each torch, and that real
steps' noise flags nobody; the light worker (light_train.py, the same file) once for the slowed rank, which is
the agents' rule, report and outputs.
"""
import json
import os
import subprocess
import time
import unittest
import urllib.request

from ddprun_testlib import torch_subject
from netns_hosts import CLUSTER, DDPRUN, NPROC, ROUND_LINE, HostsTestCase, address, wait_until

PORT = 29441
METRICS = 29451
LOAD = ("--load-seconds", "0.05")


class StragglersOnHosts(HostsTestCase):
    def start_job(self, extra=()):
        agents = []
        for h in (1, 2):
            agent_args = ("--metrics_port", str(METRICS), "--event_log_handler",
                          f"file:{self.path(f'events-h{h}.jsonl')}")
            agents.append(self.start_training(h, PORT, steps=20000, nnodes="2", extra=LOAD + tuple(extra),
                                              agent_args=agent_args))
        self.wait_for_training(agents, nodes=2)
        return agents

    def status(self):
        """`ddprun status --json` run on host 3, where no agent runs."""
        argv = ["bash", CLUSTER, "exec", "3", DDPRUN, "status", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                f"{address(1)}:{PORT}", "--rdzv_id", self.run_id, "--json"]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        return json.loads(done.stdout)

    def metrics(self, host):
        with urllib.request.urlopen(f"http://{address(host)}:{METRICS}/metrics", timeout=10) as r:
            return r.read().decode()

    def events(self, host, name):
        path = self.path(f"events-h{host}.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [e for e in map(json.loads, f) if e["event"] == name]

    def comparing_host(self):
        """The host (1 or 2) whose agent has node rank 0 in the last round: it compares the ranks."""
        def node_rank(h):
            return int(list(ROUND_LINE.finditer(self.agents[h - 1].log()))[-1][2])
        return next(h for h in (1, 2) if node_rank(h) == 0)

    def finish(self, agents):
        self.stop_training()
        self.assert_exit_zero(agents)
        results = self.assert_results(2 * NPROC)
        self.assertEqual({r["attempt"] for r in results}, {0}, "no restart")

    def test_a_slowed_rank_is_named_a_straggler(self):
        agents = self.start_job(extra=("--slow-rank", "3", "--slow-seconds", "0.15"))
        s = wait_until(lambda: (lambda j: j if any(r["straggler"] for r in j["ranks"]) else None)(self.status()),
                       90, "status: a straggler flagged", self.describe_all)
        self.assertEqual([r["rank"] for r in s["ranks"] if r["straggler"]], [3], s)
        self.assertEqual([r["straggler"] for r in s["ranks"]], [False, False, False, True], s)
        slow = s["ranks"][3]
        self.assertGreater(slow["before_collective_s"], 0.15, s)
        self.assertTrue(all(0.04 < r["before_collective_s"] < 0.15 for r in s["ranks"][:3]), s)

        judge = self.comparing_host()
        lines = [line for line in self.agents[judge - 1].log().splitlines() if "straggler:" in line]
        self.assertEqual(len(lines), 1, self.agents[judge - 1].log()[-3000:])
        self.assertIn("rank 3 on ", lines[0])
        self.assertIn("the job's median of 0.0", lines[0])
        self.assertNotIn("straggler:", self.agents[2 - judge].log())  # only node rank 0 compares
        # The episode reaches the event log and the metrics at the agent loop's next tick (the report is made
        # on the observer's thread): at most a status interval after `ddprun status` shows it.
        events = wait_until(lambda: self.events(judge, "straggler"), 10, "the straggler event", self.describe_all)
        self.assertEqual([(e["rank"], e["factor"]) for e in events], [(3, 1.5)], events)
        self.assertEqual(events[0]["rank_host"], slow["host"])
        flagged = f'ddprun_straggler{{host="{slow["host"]}",rank="3"}} 1'
        metrics = wait_until(lambda: (lambda m: m if flagged in m else None)(self.metrics(judge)), 10,
                             "the straggler metric", self.describe_all)
        self.assertIn("ddprun_straggler_episodes_total 1", metrics)
        self.assertIn('ddprun_rank_before_collective_seconds{local_rank="1",rank="3"}',
                      self.metrics(1) + self.metrics(2))
        self.finish(agents)
        for h in (1, 2):
            formed = self.events(h, "round_formed")
            self.assertEqual(len(formed), 1, formed)
            self.assertEqual(formed[0]["nodes"], 2)
            self.assertEqual([e["exit_code"] for e in self.events(h, "worker_exit")], [0] * NPROC)
            self.assertEqual(self.events(h, "agent_exit")[0]["exit_code"], 0)

    @torch_subject
    def test_a_healthy_job_names_nobody(self):
        for run in range(int(os.environ.get("DDPRUN_IT_REPEAT", "1"))):
            with self.subTest(run=run):
                if run:
                    self.tearDown_agents()
                agents = self.start_job()
                s = wait_until(lambda: (lambda j: j if all(r["before_collective_s"] is not None for r in j["ranks"])
                                        and len(j["ranks"]) == 2 * NPROC else None)(self.status()),
                               60, "status: every rank's time before its first collective", self.describe_all)
                time.sleep(32)  # 8 samples of the agent of node rank 0: more than a window of the rule
                s = self.status()
                self.assertEqual([r["straggler"] for r in s["ranks"]], [False] * (2 * NPROC), s)
                for h in (1, 2):
                    self.assertNotIn("straggler", self.agents[h - 1].log())
                    self.assertEqual(self.events(h, "straggler"), [])
                    self.assertNotIn("ddprun_straggler{", self.metrics(h))
                self.finish(agents)

    def tearDown_agents(self):
        """Between repeated runs: the previous job's files gone, a fresh run id."""
        for name in os.listdir(self.tmp):
            path = self.path(name)
            subprocess.run(["rm", "-rf", path], check=True)
        self.agents.clear()
        self.run_id = f"{self.run_id.split('-r')[0]}-r{time.monotonic_ns() % 100000}"


if __name__ == "__main__":
    unittest.main(verbosity=2)
