"""ddprun on a real 3-member etcd cluster when something fails (issue 28): the etcd leader killed mid-training and
mid-rendezvous, quorum lost, TLS with the right and a wrong CA, etcd without the v2 API, a node lost and a node
joining. The cluster itself is checked first (EtcdClusterItself). What ddprun does here does not depend on the
workers' torch, so the module runs once, with the light worker (light_train.py); test_etcd_netns.py runs the jobs
that do (torch's own launcher, a mixed job, ddprun alone) with torch 1.13 and 2.6. Set-up, helpers and cases
(c)-(h) as test_etcd_netns.py's docstring describes.
"""
import json
import re
import ssl
import unittest
import urllib.request

from netns_hosts import NPROC, ROUND_LINE, address, host_pids, rounds_of, wait_until
from test_etcd_netns import QUICK_FAIL_CONF, EtcdHostsTestCase, merged_conf


class EtcdClusterItself(EtcdHostsTestCase):
    """The test cluster does what the other tests rely on: a leader election after the leader's SIGKILL, the old
    leader rejoining with its data, TLS refusing a stranger, and nothing left after stop()."""

    def test_leader_killed_restarted_and_nothing_left(self):
        etcd = self.etcd()
        status, _ = etcd.request(0, "/v2/keys/probe", body=None)
        self.assertEqual(status, 404)  # v2 is served (a missing key, not a missing API)
        leader = etcd.leader()
        etcd.kill(leader)
        self.assertEqual(len(etcd.members_alive()), 2, etcd.describe())
        new, seconds = etcd.wait_leader_other_than(leader)
        print(f"\n  killed leader m{leader + 1}: m{new + 1} leads after {seconds:.2f} s", flush=True)
        etcd.start_member(leader)
        self.assertEqual(etcd.members_alive(), [0, 1, 2])
        self.assertIn(etcd.leader(), (0, 1, 2))
        etcd.stop()
        self.assertEqual(etcd.leftover_pids(), [])
        for host in (1, 2, 3):
            self.assertEqual(host_pids(host), [], f"left on host {host}")

    def test_tls_refuses_a_stranger_and_is_refused_by_the_wrong_ca(self):
        etcd = self.etcd(tls=True)

        def health(cafile, cert, key):
            ctx = ssl.create_default_context(cafile=cafile)
            ctx.load_cert_chain(cert, key)
            try:
                with urllib.request.urlopen(f"https://{etcd.endpoint(0)}/health", timeout=5, context=ctx) as r:
                    return r.read().decode()
            except (OSError, ssl.SSLError) as e:  # URLError wraps the TLS error
                return f"error: {e}"

        self.assertIn('"health":"true"', health(etcd.ca_file, etcd.client_cert, etcd.client_key))
        # The client does not trust the server (another CA): certificate verify failed.
        self.assertIn("certificate verify failed", health(etcd.wrong_ca_file, etcd.client_cert, etcd.client_key))
        # The server does not trust the client (--client-cert-auth, a certificate of another CA).
        refused = health(etcd.ca_file, etcd.wrong_client_cert, etcd.wrong_client_key)
        self.assertTrue(refused.startswith("error:"), refused)


class DdprunRecoveryOnEtcd(EtcdHostsTestCase):
    """ddprun on etcd when etcd or a node fails, and etcd input ddprun must refuse."""

    def leader_killed_mid_training(self, backend):
        etcd = self.etcd()
        agents = [self.ddprun(h, backend, 3, steps=2000) for h in (1, 2, 3)]
        self.wait_steps()
        leader = etcd.leader()
        etcd.kill(leader)
        new, seconds = etcd.wait_leader_other_than(leader)
        print(f"\n  {backend}: killed etcd leader m{leader + 1}; m{new + 1} leads after {seconds:.1f} s", flush=True)
        self.wait_steps(self.steps_logged() + 2)  # trains on after the election
        self.stop_training()
        self.assert_job(agents, 3 * NPROC)

    def test_c_etcd_leader_killed_mid_training_etcd(self):
        self.leader_killed_mid_training("etcd")

    def test_c_etcd_leader_killed_mid_training_etcd_v2(self):
        self.leader_killed_mid_training("etcd-v2")

    def leader_killed_mid_rendezvous(self, backend):
        etcd = self.etcd()
        agents = [self.ddprun(h, backend, 3) for h in (1, 2)]
        # Both agents have joined: the legacy protocol's active_version lists 2 participants; the dynamic
        # state (an opaque blob) exists and both agents still wait.
        def joined():
            keys = self.rendezvous_keys()
            if backend == "etcd":
                return any(k.endswith("/rdzv/active_version") and len(json.loads(v).get("participants", [])) == 2
                           for k, v in keys.items())
            return bool(keys)

        wait_until(self.running(joined), 60, "two agents in the rendezvous", lambda: f"{self.rendezvous_keys()}\n"
                                                                       f"{self.describe_all()}")
        self.assertTrue(all(a.proc.poll() is None for a in agents), self.describe_all())
        leader = etcd.leader()
        etcd.kill(leader)
        agents.append(self.ddprun(3, backend, 3))
        self.assert_job(agents, 3 * NPROC)

    def test_d_etcd_leader_killed_mid_rendezvous_etcd(self):
        self.leader_killed_mid_rendezvous("etcd")

    def test_d_etcd_leader_killed_mid_rendezvous_etcd_v2(self):
        self.leader_killed_mid_rendezvous("etcd-v2")

    def quorum_lost_before_the_start(self, backend):
        etcd = self.etcd()
        etcd.kill(0)
        etcd.kill(1)
        # Member 3 runs but has no quorum: its reads may answer, its writes cannot.
        agent = self.ddprun(4, backend, 2, conf=QUICK_FAIL_CONF[backend])
        rc, elapsed, log = self.assert_fails(agent, 60)
        self.assertLess(elapsed, 5 + 20, f"read_timeout=5 but ddprun took {elapsed:.1f} s\n{log}")
        for endpoint in (etcd.endpoint(0), etcd.endpoint(1)):
            self.assertIn(endpoint, log, log)
        wait_until(lambda: not host_pids(4), 15, "no process left on host 4",
                   lambda: f"left on host 4: {host_pids(4)}")

    def test_e_two_of_three_members_dead_fails_naming_them_etcd(self):
        self.quorum_lost_before_the_start("etcd")

    def test_e_two_of_three_members_dead_fails_naming_them_etcd_v2(self):
        self.quorum_lost_before_the_start("etcd-v2")

    def tls(self, backend):
        """Trains on the TLS cluster with the right CA and client certificate; with an unrelated CA, exits
        non-zero and says it is about the certificate."""
        etcd = self.etcd(tls=True)
        if backend == "etcd":
            conf = f"protocol=https,cacert={{ca}},cert={etcd.client_cert},key={etcd.client_key}"
        else:
            conf = f"protocol=https,ssl_cert={etcd.client_cert},ssl_cert_key={etcd.client_key},ca_cert={{ca}}"
        agents = [self.ddprun(h, backend, 2, conf=conf.format(ca=etcd.ca_file)) for h in (1, 2)]
        self.assert_job(agents, 2 * NPROC)
        wrong = self.ddprun(4, backend, 2, conf=merged_conf(conf.format(ca=etcd.wrong_ca_file),
                                                             QUICK_FAIL_CONF[backend]))
        rc, elapsed, log = self.assert_fails(wrong, 60)
        self.assertIn("certificate", log.lower(), log)

    def test_f_tls_cluster_trains_and_the_wrong_ca_is_refused_etcd(self):
        self.tls("etcd")

    def test_f_tls_cluster_trains_and_the_wrong_ca_is_refused_etcd_v2(self):
        self.tls("etcd-v2")

    def test_h_etcd_without_the_v2_api_is_named(self):
        # etcd 3.4 serves only the v3 API unless --enable-v2 (3.6 has no v2 at all): both backends need v2.
        self.etcd(v2=False)
        for host, backend in ((1, "etcd"), (2, "etcd-v2")):
            agent = self.ddprun(host, backend, 2, conf=QUICK_FAIL_CONF[backend])
            rc, elapsed, log = self.assert_fails(agent, 60)
            self.assertIn(address(1), log, log)  # the endpoint, and what it lacks
            self.assertRegex(log, r"v2 API|enable-v2", log)

    def test_g_etcd_v2_node_lost_and_node_joining(self):
        self.node_lost_and_node_joining("etcd-v2")

    def test_g_etcd_node_lost_and_node_joining(self):
        # torch's protocol: the lost node's keep-alive key expires (TTL 10 s), ddprun's watcher sees it gone.
        self.node_lost_and_node_joining("etcd")

    def test_i_hang_detection_and_prestart_on_etcd(self):
        """--hang_timeout and --prestart do not depend on the backend: a rank that hangs in round 0 is found, the
        group restarts from its prestarted standbys, and the job finishes."""
        self.etcd()
        flags = ["--hang_timeout", "4", "--prestart"]
        train = ["--hang-rank", "1", "--hang-step", "10", "--hang-attempt", "0"]
        agents = [self.ddprun(h, "etcd", 2, max_restarts=1, flags=flags, train=train) for h in (1, 2)]
        self.assert_job(agents, 2 * NPROC)
        logs = "".join(a.log() for a in agents)
        self.assertIn("no rank made progress for 4 s (--hang_timeout)", logs, self.describe_all())
        for agent in agents:
            self.assertEqual([r[0] for r in rounds_of(agent.log())], [0, 1], agent.describe())

    def node_lost_and_node_joining(self, backend):
        self.etcd()
        agents = [self.ddprun(h, backend, "2:3", steps=2000) for h in (1, 2, 3)]
        self.wait_for_round(agents, nodes=3)
        victim = agents[2]
        victim.killed = True
        victim.proc.kill()
        victim.proc.wait(timeout=10)
        wait_until(lambda: set(host_pids(3)) <= set(self.etcd_pids(3)), 15,
                   "host 3's workers to die with their agent")
        self.wait_for_round(agents[:2], nodes=2)
        agents.append(self.ddprun(4, backend, "2:3", steps=2000))
        self.wait_for_round([agents[0], agents[1], agents[3]], nodes=3)
        self.stop_training()
        survivors = [agents[0], agents[1], agents[3]]
        self.assert_exit_zero(survivors)
        for agent in survivors:
            rounds = rounds_of(agent.log())
            self.assertEqual(rounds[-1][1:], (3, 3 * NPROC), f"rounds {rounds}\n{agent.describe()}")
        self.assert_results(3 * NPROC)

    def wait_for_round(self, agents, nodes):
        """Every agent of `agents` runs its workers in a round of `nodes` nodes, and rank 0 (on whichever of them:
        torch's etcd protocol ranks nodes in their order of arrival, so a newcomer may be node 0) trains in it."""
        def training():
            lasts = [list(ROUND_LINE.finditer(a.log()))[-1:] for a in agents]
            if not all(last and int(last[0][3]) == nodes for last in lasts):
                return False
            return any(re.search(r"step \d+/\d+ loss", a.log()[last[0].end():]) for a, last in zip(agents, lasts))

        wait_until(self.running(training), 90, f"training steps in a round of {nodes} nodes", self.describe_all)

    def etcd_pids(self, host):
        """The pids on `host` that are its etcd member (host 3 runs one besides its agent)."""
        m = self.cluster.members[host - 1]
        return [m.proc.pid] if m.alive() else []


if __name__ == "__main__":
    unittest.main(verbosity=2)
