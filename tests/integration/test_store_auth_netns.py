"""A job's store that lets in only its job (--rdzv_secret_file, docs/security.md), on real hosts (network
namespaces, tests/integration/netns_hosts.py): a c10d job of 2 hosts x 2 ranks whose agents share a secret - real
gloo DDP ranks (scripts/examples/ddp_train.py) with every torch version, whose TCPStore clients the store must
admit; host 3 is a stranger on the same network, and tries, against the job's store on host 1:
  - to read the job's keys (its status), to write the round's stop key, to add to the round's join counter, and
    to connect as a worker client (torch's TCPStore, its own keys) — each refused: the store closes the
    connection (the stranger's next request fails) and logs the refusal with the stranger's address;
  - to join as an agent without the secret, and with a wrong secret — each refused: the agent exits 4, naming
    why ("needs an agent that proved the job's secret", "is not this job's: a wrong proof");
and the job trains to the end with identical parameters on every rank, exit 0, no restart. After the store's host
is killed in a 3-host job, the standby store that takes over refuses the same attacks from host 4. The same job
without a secret is open as before (the stranger reads its status). With --local_addr the store listens on that
address only (host 1's loopback is refused). The failover, --local_addr and the open store run the light worker
(light_train.py) once: what they prove is the agents' and the store's doing. The attacks use torch's own TCPStore
client of the torch the module runs with.
"""
import os
import subprocess
import textwrap
import unittest

import re

from netns_hosts import (CLUSTER, DDPRUN, NPROC, RDZV_CONF, HostsTestCase, address, host_pids,
                         kill_host_processes, wait_until)
from ddprun_testlib import PYTHON, torch_subject

PORT = 29461

# Run on the stranger host: each attack with torch's own TCPStore client; prints one line per attack.
ATTACKS = textwrap.dedent("""
    import datetime, sys
    import torch.distributed as dist
    host, port, run = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def client():
        return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))

    def attack(name, act):
        try:
            s = client()
            act(s)
            s.get("attack/probe")  # SET has no reply: a refused SET shows on the next request
            print(name, "ALLOWED", flush=True)
        except Exception as e:
            print(name, "refused", type(e).__name__, flush=True)

    attack("read-status", lambda s: s.get(f"ddprun/{run}/status/n"))
    attack("write-stop", lambda s: s.set(f"ddprun/{run}/r0/stop", "stranger"))
    attack("add-join-counter", lambda s: s.add(f"ddprun/{run}/r1/joined", 1))
    attack("worker-client", lambda s: s.set("default_pg/stranger", "x"))
""")


class StoreAuthOnHosts(HostsTestCase):
    def secret_file(self, name="job.secret", text=None):
        path = self.path(name)
        with open(path, "w") as f:
            f.write(text or os.urandom(32).hex() + "\n")
        os.chmod(path, 0o600)
        return path

    def on_host(self, host, argv, timeout=120):
        done = subprocess.run(["bash", CLUSTER, "exec", str(host), *argv], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr

    def attacks(self, stranger=3, store=None):
        """The attacks from host `stranger` against the store at `store` (host 1's port PORT by default)."""
        script = self.path("attacks.py")
        with open(script, "w") as f:
            f.write(ATTACKS)
        host, port = store or (address(1), PORT)
        rc, out, err = self.on_host(stranger, [PYTHON, script, host, str(port), self.run_id])
        self.assertEqual(rc, 0, out + err)
        return dict(line.split(" ", 2)[:2] for line in out.splitlines())

    def stranger_agent(self, *secret_args):
        """A ddprun agent on host 3 that tries to join the job: (exit code, its log)."""
        rc, out, err = self.on_host(3, [DDPRUN, "--nnodes", "2:3", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                                        "--rdzv_endpoint", f"{address(1)}:{PORT}", "--rdzv_id", self.run_id,
                                        "--rdzv_conf", RDZV_CONF, *secret_args, "--no_python", "/bin/true"])
        return rc, out + err

    @torch_subject
    def test_a_stranger_is_refused_and_the_job_is_unharmed(self):
        secret = self.secret_file()
        agents = [self.start_training(h, PORT, steps=20000, nnodes="2",
                                      agent_args=("--rdzv_secret_file", secret)) for h in (1, 2)]
        self.wait_for_training(agents, nodes=2)

        results = self.attacks()
        self.assertEqual(results, {"read-status": "refused", "write-stop": "refused", "add-join-counter": "refused",
                                   "worker-client": "refused"})
        rc, log = self.stranger_agent()
        self.assertEqual(rc, 4, log)
        self.assertIn("lacks the job's secret", log)
        rc, log = self.stranger_agent("--rdzv_secret_file", self.secret_file("wrong.secret"))
        self.assertEqual(rc, 4, log)
        self.assertIn("is not this job's: a wrong proof", log)

        store_log = agents[0].log()
        self.assertIn(f"store: refused client {address(3)}", store_log.replace("[::ffff:", "").replace("]:", ":"))
        self.stop_training()
        self.assert_exit_zero(agents)
        results = self.assert_results(2 * NPROC)
        self.assertEqual({r["attempt"] for r in results}, {0}, "no restart")
        for a in agents:
            self.assertNotIn("restarting", a.log())

    def test_the_standby_store_keeps_the_secret_after_a_failover(self):
        secret = self.secret_file()
        agents = [self.start_training(h, PORT, steps=20000, nnodes="2:3",
                                      agent_args=("--rdzv_secret_file", secret)) for h in (1, 2, 3)]
        self.wait_for_training(agents[0], nodes=3)
        kill_host_processes(1)  # the store's host
        wait_until(lambda: not host_pids(1), 15, "host 1's processes to die")
        self.wait_for_training(agents[1], nodes=2)
        subnet = re.escape(address(1).rsplit(".", 1)[0])
        took_over = re.search(rf"this node \(({subnet}\.\d+):(\d+)\) hosts the job's store from now on",
                              agents[1].log() + agents[2].log())
        self.assertTrue(took_over, self.describe_all())
        standby = (took_over[1], int(took_over[2]))
        results = self.attacks(stranger=4, store=standby)
        self.assertEqual(set(results.values()), {"refused"}, results)
        self.stop_training()
        self.assert_exit_zero(agents[1:])
        results = self.assert_results(2 * NPROC)
        self.assertEqual(len({r["attempt"] for r in results}), 1, results)

    def test_local_addr_binds_the_store_to_that_address(self):
        agents = [self.start_training(h, PORT, steps=20000, nnodes="2", agent_args=("--local_addr", address(h)))
                  for h in (1, 2)]
        self.wait_for_training(agents, nodes=2)
        probe = ("import socket, sys\n"
                 "try:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close(); print('open')\n"
                 "except OSError as e:\n    print('refused', e)\n")
        answers = {where: self.on_host(1, [PYTHON, "-c", probe, where, str(PORT)])[1].split()[0]
                   for where in (address(1), "127.0.0.1")}
        self.assertEqual(answers, {address(1): "open", "127.0.0.1": "refused"})
        self.stop_training()
        self.assert_exit_zero(agents)

    def test_without_a_secret_the_store_stays_open(self):
        agents = [self.start_training(h, PORT, steps=20000, nnodes="2") for h in (1, 2)]
        self.wait_for_training(agents, nodes=2)
        rc, out, err = self.on_host(3, [DDPRUN, "status", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                                        f"{address(1)}:{PORT}", "--rdzv_id", self.run_id, "--json"])
        self.assertEqual(rc, 0, err)  # an open store: anyone on the network reads (and could write) it
        self.stop_training()
        self.assert_exit_zero(agents)


if __name__ == "__main__":
    unittest.main(verbosity=2)
