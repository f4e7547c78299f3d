"""The light test worker (light_train.py) and its store client (tcpstore_client.py), which the netns tests use where
torch is not their subject: they must keep ddp_train.py's contract, or those tests prove nothing.

StoreClient - tcpstore_client.TCPStoreClient against ddprun-store (legacy dialect): SET/GET/ADD/COMPARE_SET/
CHECK, a WAIT answered later by another client's SET, a WAIT that times out, a store that goes away.
LightTrain - light_train.py under ddprun (and alone, for torch's env:// rule):
  - 2 agents x 2 ranks train in lock step: ranks 0..3 once each, one checksum, the attempt, the env contract;
    the checksum is the one a single rank computes alone for the same world (the sums are every rank's);
  - a rank that crashes (--fail-until-attempt) is restarted, the group resumes from rank 0's checkpoint and
    agrees; the heartbeat file holds the global step;
  - a rank that dies is seen by the others at once: they exit 1 naming the step (no --pg-timeout wait); one
    that hangs (--hang-*) makes the others exit 1 after --pg-timeout, naming the silent rank;
  - without the agent's store (TORCHELASTIC_USE_AGENT_STORE=False) rank 0 listens on MASTER_PORT;
  - --stop-file ends every rank at the same step; the hung rank's stack shows stuck_in_data_loading.
No torch anywhere: the module runs in the quick tier.
"""
import glob
import os
import subprocess
import threading
import time
import unittest

from ddprun_testlib import HOST_PYTHON, IntegrationTestCase, free_port, read_json_file, wait_until
from tcpstore_client import StoreLost, StoreTimeout, TCPStoreClient

HERE = os.path.dirname(os.path.abspath(__file__))
LIGHT_TRAIN = os.path.join(HERE, "light_train.py")
STORE = os.environ.get("DDPRUN_STORE")


class StoreClient(IntegrationTestCase):
    def setUp(self):
        super().setUp()
        if not STORE:
            raise RuntimeError("DDPRUN_STORE must name ddprun-store (tests/integration/CMakeLists.txt sets it)")
        self.store = self.start(["--host", "127.0.0.1", "--port", "0"], program=STORE)
        line = wait_until(lambda: "listening on" in self.store.stdout() and self.store.stdout(), 20,
                          "ddprun-store to listen", self.store.describe)
        self.port = int(line.split("listening on ")[1].split()[0].rsplit(":", 1)[1])

    def client(self, timeout=10):
        c = TCPStoreClient("127.0.0.1", self.port, timeout=timeout)
        self.addCleanup(c.close)
        return c

    def test_requests(self):
        c = self.client()
        c.set("/k", "v")
        self.assertEqual(c.get("/k"), b"v")
        self.assertEqual(c.get("/missing"), b"")
        self.assertEqual(c.add("/n", 2), 2)
        self.assertEqual(c.add("/n", 3), 5)
        self.assertEqual(c.get("/n"), b"5")
        self.assertEqual(c.compare_set("/k", "v", "w"), b"w")
        self.assertEqual(c.compare_set("/k", "v", "x"), b"w")
        self.assertTrue(c.check(["/k", "/n"]))
        self.assertFalse(c.check(["/k", "/absent"]))
        self.assertTrue(c.local_address().startswith("127.0.0.1"))

    def test_a_wait_ends_when_another_client_sets_the_key(self):
        waiter, setter = self.client(), self.client()
        timer = threading.Timer(0.2, lambda: setter.set("/late", "1"))
        timer.start()
        self.addCleanup(timer.cancel)
        waiter.wait(["/late"], timeout=10)
        self.assertEqual(waiter.get("/late"), b"1")

    def test_a_wait_times_out_and_a_gone_store_is_lost(self):
        c = self.client()
        with self.assertRaisesRegex(StoreTimeout, r"did not appear .* within 0.3 s"):
            c.wait(["/never"], timeout=0.3)
        other = self.client()
        other.set("/x", "1")
        self.store.proc.kill()
        self.store.wait(10)
        with self.assertRaises(StoreLost):
            other.get("/x")
        with self.assertRaisesRegex(StoreTimeout, "no store answers"):
            TCPStoreClient("127.0.0.1", self.port, timeout=0.3)


class LightTrain(IntegrationTestCase):
    def two_agents(self, script_args, extra=(), nproc=2):
        port = free_port()
        return [self.start(["--nnodes", "2", "--node_rank", str(node), "--master_addr", "127.0.0.1",
                            "--master_port", str(port), "--nproc_per_node", str(nproc), "--rdzv_id", "light",
                            *extra, "--python", HOST_PYTHON, LIGHT_TRAIN,
                            *script_args]) for node in range(2)]

    def results(self):
        found = [read_json_file(p) for p in sorted(glob.glob(self.path("out", "rank*.json")))]
        return sorted(found, key=lambda r: r["rank"])

    def describe(self, agents):
        return "\n".join(a.describe() for a in agents)

    def test_ranks_train_in_lock_step_and_agree(self):
        agents = self.two_agents(["--steps", "12", "--step-seconds", "0", "--out", self.path("out"),
                                  "--log-every", "4"])
        self.assertEqual([a.wait(60) for a in agents], [0, 0], self.describe(agents))
        results = self.results()
        self.assertEqual([r["rank"] for r in results], [0, 1, 2, 3], results)
        self.assertEqual([(r["group_rank"], r["local_rank"]) for r in results], [(0, 0), (0, 1), (1, 0), (1, 1)])
        self.assertTrue(all(r["world_size"] == 4 and r["attempt"] == 0 and r["identical"] for r in results))
        self.assertEqual(len({r["checksum"] for r in results}), 1, results)
        self.assertEqual(results[0]["checksum"], alone(12, world=4), "the sums must be every rank's")
        self.assertRegex(agents[0].stdout(), r"step 12/12 loss [\d.]+ \(\d+ samples/s\)")
        self.assertIn("done: 4 ranks, final loss", agents[0].stdout())

    def test_a_crashed_rank_restarts_from_the_checkpoint(self):
        stamps = self.path("stamps")
        agents = self.two_agents(["--steps", "20", "--step-seconds", "0", "--out", self.path("out"),
                                  "--checkpoint", self.path("ckpt"), "--save-every", "5", "--fail-rank", "3",
                                  "--fail-step", "7", "--fail-until-attempt", "1", "--stamp", stamps],
                                 ["--max_restarts", "1", "--log_dir", self.path("logs")])
        self.assertEqual([a.wait(60) for a in agents], [0, 0], self.describe(agents))
        results = self.results()
        self.assertTrue(all(r["attempt"] == 1 and r["identical"] for r in results), results)
        self.assertEqual(results[0]["checksum"], alone(20, world=4), "resumed from step 5's checkpoint")
        self.assertIn("resumed from", agents[0].stdout())
        self.assertRegex(agents[0].stdout(), r"resumed from .*ckpt at step 5\b")
        self.assertIn("rank 3: crashing at step 7 (attempt 0)", agents[1].output())
        with open(stamps) as f:
            events = [line.split()[:3] for line in f]
        self.assertEqual(sorted(e for e in events if e[0] == "crash"), [["crash", "0", "3"]])
        self.assertEqual(len([e for e in events if e[0] == "first-step"]), 8, events)
        progress = glob.glob(self.path("logs", "*", "attempt_1", "0", "progress"))
        with open(progress[0]) as f:
            self.assertEqual(int(f.read().split()[0]), 20)

    def alone_processes(self, world, script_args):
        """`world` ranks of light_train.py started directly, as torch's env:// rule has them (no agent store:
        rank 0 listens on MASTER_PORT); returns [(exit code, stderr)] by rank."""
        port = free_port()
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="False",
                       TORCHELASTIC_RESTART_COUNT="0", DDPRUN_IT_TOKEN=self.token)
            procs.append(subprocess.Popen([HOST_PYTHON, LIGHT_TRAIN, *script_args], env=env, cwd=self.tmp,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        return [(p.wait(60), p.stderr.read()) for p in procs]

    def test_without_the_agent_store_rank_0_listens_on_master_port(self):
        ended = self.alone_processes(3, ["--steps", "6", "--step-seconds", "0", "--out", self.path("out")])
        self.assertEqual([code for code, _ in ended], [0, 0, 0], ended)
        results = self.results()
        self.assertEqual(len({r["checksum"] for r in results}), 1, results)
        self.assertEqual(results[0]["checksum"], alone(6, world=3))

    def test_a_dead_rank_is_seen_at_once_and_a_silent_one_after_the_timeout(self):
        # Rank 2 crashes: the others fail on the closed connection at once, not after --pg-timeout (600 s).
        started = time.monotonic()
        ended = self.alone_processes(3, ["--steps", "50", "--step-seconds", "0.01", "--fail-rank", "2",
                                         "--fail-step", "5", "--fail-until-attempt", "1", "--pg-timeout", "600"])
        self.assertLess(time.monotonic() - started, 60)
        self.assertEqual([code for code, _ in ended], [1, 1, 3], ended)
        self.assertIn("rank 0: the group failed at step 6: rank 2 closed its connection", ended[0][1])
        self.assertIn("rank 1: the group failed at step 6: rank 0 closed its connection", ended[1][1])
        # Rank 1 of a 2-rank group hangs: rank 0 names it after --pg-timeout and exits 1.
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "2", "--python", HOST_PYTHON, LIGHT_TRAIN,
                                    "--steps", "50", "--step-seconds", "0", "--hang-rank", "1", "--hang-step", "3",
                                    "--pg-timeout", "1"], timeout=60)
        self.assertEqual(rc, 1, agent.describe())
        self.assertIn("rank 1: hanging at step 3 (attempt 0)", agent.output())
        self.assertIn("rank 0: the group failed at step 3: rank 1 sent nothing for 1 s", agent.output())

    def test_the_stop_file_ends_every_rank_at_one_step_and_a_hang_shows_its_stack(self):
        open(self.path("stop"), "w").close()
        agents = self.two_agents(["--steps", "1000", "--step-seconds", "0", "--stop-file", self.path("stop"),
                                  "--stop-every", "4", "--out", self.path("out")])
        self.assertEqual([a.wait(60) for a in agents], [0, 0], self.describe(agents))
        self.assertIn("stopping after step 4:", agents[0].stdout())
        self.assertEqual(len({r["checksum"] for r in self.results()}), 1)
        agent, rc = self.run_agent(["--standalone", "--nproc_per_node", "2", "--hang_timeout", "2",
                                    "--python", HOST_PYTHON, LIGHT_TRAIN, "--steps", "100", "--hang-rank", "1",
                                    "--hang-step", "3"], timeout=60)
        self.assertEqual(rc, 6, agent.describe())
        self.assertRegex(agent.stderr(), r"where the ranks are: .*rank 1: .*stuck_in_data_loading "
                                         r"\(light_train\.py:\d+\)", agent.describe())


def alone(steps, world):
    """The checksum light_train.py's ranks must agree on after `steps` steps from scratch in a group of `world`
    (computed here as the group's sums would be)."""
    import light_train
    param = 1
    for step in range(steps):
        param = (param + sum(light_train.gradient(param, r, step) for r in range(world))) % light_train.MODULUS
    return param


if __name__ == "__main__":
    unittest.main(verbosity=2)
