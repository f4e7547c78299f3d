"""ddprun-launch against torch's own `python -m torch.distributed.launch` (torch 1.13; 2.6 in the .torch26
variant): the same flags give every worker the same arguments — --local_rank=N (torch 1.x) or --local-rank=N
(torch 2.x) before the script's own, none with --use_env — and the same LOCAL_RANK. What compares with torch's
launchers runs with every torch version; ddprun-launch's own choices and the newer torchrun flags with shell
workers run once (ddprun_testlib.torch_subject)."""
import glob
import json
import os
import socket
import unittest

from ddprun_testlib import DDPRUN, PYTHON, IntegrationTestCase, torch_subject

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_worker.py")
DDPRUN_LAUNCH = os.path.join(os.path.dirname(DDPRUN), "ddprun-launch")
NPROC = 2
# Debian's torch 1.13.1 launchers crash at their start without -r/-t (docs/benchmarks.md); both get them.
COMMON = ["--standalone", "--nproc_per_node", str(NPROC), "--redirects", "1", "--tee", "1"]


class LaunchCompat(IntegrationTestCase):
    def launch(self, program, prefix, flags, name):
        out = self.path(name)
        os.makedirs(out)
        agent, rc = self.run_agent(prefix + COMMON + flags + [WORKER, "first", "second"], 180,
                                   env={"LAUNCH_OUT": out}, program=program)
        self.assertEqual(rc, 0, agent.describe())
        results = []
        for rank in range(NPROC):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                results.append(json.load(f))
        return results

    def both(self, flags):
        """(torch.distributed.launch's results, ddprun-launch's results) for the same flags."""
        torch = self.launch(PYTHON, ["-m", "torch.distributed.launch"], flags, "torch")
        ours = self.launch(DDPRUN_LAUNCH, ["--python", PYTHON], flags, "ddprun")
        return torch, ours

    @torch_subject
    def test_the_local_rank_argument_is_the_one_torch_launch_passes(self):
        torch, ours = self.both([])
        self.assertEqual(ours, torch)
        for rank, r in enumerate(ours):
            self.assertEqual(r["local_rank"], rank, r)
            self.assertRegex(r["argv"][0], rf"^--local[-_]rank={rank}$")
            self.assertEqual(r["argv"][1:], ["first", "second"])

    @torch_subject
    def test_use_env_passes_no_argument(self):
        torch, ours = self.both(["--use_env"])
        self.assertEqual(ours, torch)
        for rank, r in enumerate(ours):
            self.assertEqual(r, {"argv": ["first", "second"], "local_rank": None, "LOCAL_RANK": str(rank)})

    def test_a_chosen_spelling_and_no_python_without_use_env(self):
        ours = self.launch(DDPRUN_LAUNCH, ["--python", PYTHON], ["--local_rank_style", "underscore"], "underscore")
        self.assertEqual([r["argv"][0] for r in ours], [f"--local_rank={r}" for r in range(NPROC)])
        agent, rc = self.run_agent(COMMON + ["--no_python", "/bin/true"], 30, program=DDPRUN_LAUNCH)
        self.assertEqual(rc, 2, agent.describe())
        self.assertIn("--no_python needs --use_env", agent.stderr())
        self.assertEqual(self.live_processes(), [])

    @torch_subject
    def test_newer_torchrun_flags_virtual_local_rank_and_numa_binding(self):
        """--virtual-local-rank: LOCAL_RANK=0 and one device each, in a real launch; --numa-binding on a machine
        without GPUs: exit 2, nothing started. This torchrun (1.13 or 2.6) has neither flag."""
        out = self.path("vlr")
        os.makedirs(out)
        script = 'echo "$LOCAL_RANK $CUDA_VISIBLE_DEVICES $RANK" > "$VLR_OUT/$RANK"'
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", str(NPROC), "--virtual-local-rank",
                                    "--no_python", "/bin/sh", "-c", script], 60,
                                   env={"VLR_OUT": out, "CUDA_VISIBLE_DEVICES": "5, 7"})
        self.assertEqual(rc, 0, agent.describe())
        for rank, device in enumerate(["5", "7"]):
            with open(os.path.join(out, str(rank))) as f:
                self.assertEqual(f.read().split(), ["0", device, str(rank)])
        if not os.path.exists("/proc/driver/nvidia/gpus"):
            agent, rc = self.run_agent(["--standalone", "--numa-binding", "node", "--no_python", "/bin/true"], 30)
            self.assertEqual(rc, 2, agent.describe())
            self.assertIn("--numa-binding=node: local rank 0 has no GPU 0", agent.stderr())
            self.assertEqual(self.live_processes(), [])
        torchrun, rc = self.run_agent(["-m", "torch.distributed.run", "--virtual-local-rank", "/bin/true"], 60,
                                      program=PYTHON)
        self.assertEqual(rc, 2, torchrun.describe())
        self.assertIn("unrecognized arguments: --virtual-local-rank", torchrun.stderr())

    def test_newer_torchrun_flags_duplicate_filters_and_event_log(self):
        """--duplicate-*-filters: the tee'd lines of the shown ranks that match go, with torch's prefix, to the
        attempt's filtered_*.log (created even when nothing matches); --event-log-handler=console: torch's
        event lines on stderr, in torch's order."""
        logs = self.path("logs")
        script = 'echo "keep $LOCAL_RANK"; echo "drop $LOCAL_RANK"; echo "keep on stderr" >&2'
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", str(NPROC), "--tee", "3", "--log_dir", logs,
                                    "--local_ranks_filter", "0", "--duplicate-stdout-filters", "keep,nothing",
                                    "--duplicate-stderr-filters", "absent", "--event-log-handler", "console",
                                    "--no_python", "/bin/sh", "-c", script], 60)
        self.assertEqual(rc, 0, agent.describe())
        [attempt] = glob.glob(os.path.join(logs, "*", "attempt_0"))
        with open(os.path.join(attempt, "filtered_stdout.log")) as f:
            self.assertEqual(f.read(), "[default0]:keep 0\n")  # local rank 1 is not shown: not tailed
        with open(os.path.join(attempt, "filtered_stderr.log")) as f:
            self.assertEqual(f.read(), "")
        events = [json.loads(line) for line in agent.stderr().splitlines()
                  if line.startswith('{"name": "torchelastic.worker.status.')]
        self.assertEqual([(e["source"], e["metadata"]["state"]) for e in events],
                         [("AGENT", "RENDEZVOUS"), ("AGENT", "ASSIGN_WORKER_RANKS"), ("WORKER", "SUCCEEDED"),
                          ("WORKER", "SUCCEEDED"), ("AGENT", "SUCCEEDED")])
        first, worker1, last = events[0]["metadata"], events[3]["metadata"], events[4]["metadata"]
        self.assertEqual(list(first), ["run_id", "global_rank", "group_rank", "worker_id", "role", "hostname",
                                       "state", "total_run_time", "rdzv_backend", "raw_error", "metadata",
                                       "agent_restarts", "duration_ms"])
        self.assertEqual((first["group_rank"], first["rdzv_backend"], first["hostname"]),
                         (None, "c10d", socket.getfqdn()))
        self.assertIsInstance(first["duration_ms"], float)
        self.assertEqual(json.loads(first["metadata"]), {"group_world_size": None, "entry_point": "sh"})
        self.assertEqual((worker1["global_rank"], worker1["group_rank"], worker1["duration_ms"]), (1, 0, None))
        self.assertEqual(json.loads(worker1["metadata"]),
                         {"group_world_size": 1, "entry_point": "sh", "local_rank": [1], "role_rank": [1],
                          "role_world_size": [2], "exit_code": [None], "worker_pid": [None]})
        self.assertEqual((last["worker_id"], last["raw_error"]), (None, None))
        # LOGLEVEL=WARNING hides them, as torch's events logger does.
        agent, rc = self.run_agent(["--standalone", "--event-log-handler", "console", "--no_python", "/bin/true"],
                                   60, env={"LOGLEVEL": "WARNING"})
        self.assertEqual(rc, 0, agent.describe())
        self.assertNotIn("torchelastic.worker.status", agent.stderr())


if __name__ == "__main__":
    unittest.main()
