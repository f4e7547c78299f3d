"""A real etcd cluster for tests and benchmarks: one member per network-namespace host, or one local member.

    cluster = EtcdCluster(directory)              # members on test hosts 1..3 (scripts/test-cluster.sh)
    cluster.start()                               # returns once every member reports healthy (or raises)
    cluster.endpoints()                           # "10.99.0.1:2379,10.99.0.2:2379,10.99.0.3:2379"
    cluster.kill(cluster.leader()); cluster.start_member(i); cluster.make_leader(i)
    cluster.stop()                                # SIGKILL, waited for; also from __exit__

    member = start_local_member(directory)        # one member on 127.0.0.1, free ports; member.endpoints()

Members: /usr/bin/etcd (3.4) with client URL http(s)://ADDR:2379 and peer URL http://ADDR:2380, `--enable-v2`
unless v2=False (etcd 3.4 serves only the v3 API by default: the "etcd without v2" case), data directories
under `directory` (member-N.etcd), their output in member-N.log, a unique --initial-cluster-token per cluster
and `--initial-cluster-state new`; a member restarted with start_member() rejoins with `existing` and its old
data directory. On test hosts a member runs through `test-cluster.sh exec`, which execs all the way down: the
pid Popen returns is etcd's, so SIGKILL to it is the host's etcd dying.

tls=True: a CA, a server certificate per member (SAN IP:ADDR and IP:127.0.0.1), a client certificate, and an
unrelated second CA with its own client certificate (the wrong-CA case), all made with the `openssl` command;
members serve clients over https with --client-cert-auth (a client without a certificate of the CA is
refused). Peers talk plain http. The paths: ca_file, client_cert, client_key, wrong_ca_file, wrong_client_cert,
wrong_client_key.

Health: GET /health on the client URL ({"health": "true"} once the member has a leader); the leader: POST
/v3/maintenance/status (etcd's gRPC gateway, present with and without v2), whose header names the member and
its leader. Every wait has a deadline. Nothing of a cluster outlives stop(): besides the members' own pids it
SIGKILLs any process whose command line names this cluster's data directories. Standard library only.
"""
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid

from host_set import host_address  # the hosts of this process's set

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.environ.get("REPO") or os.path.dirname(os.path.dirname(HERE))
CLUSTER = os.path.join(REPO, "scripts", "test-cluster.sh")
ETCD = os.environ.get("DDPRUN_ETCD", "/usr/bin/etcd")
CLIENT_PORT = 2379
PEER_PORT = 2380
START_TIMEOUT = 60  # seconds for a fresh cluster to elect a leader and report healthy (a loaded 2-core machine)




def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args, cwd):
    done = subprocess.run(["openssl", *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed ({done.returncode}):\n{done.stdout}")


class Certificates:
    """Test PKI made with the openssl command in `directory` (see the module comment)."""

    def __init__(self, directory, server_addresses):
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.ca_file, ca_key = self._ca("ca", "ddprun test etcd CA")
        self.wrong_ca_file, wrong_key = self._ca("wrong-ca", "unrelated CA")
        self.server = {}  # address -> (cert, key)
        for addr in server_addresses:
            sans = f"IP:{addr},IP:127.0.0.1,DNS:localhost"
            self.server[addr] = self._leaf(f"server-{addr}", f"etcd {addr}", "ca", sans, "serverAuth,clientAuth")
        self.client_cert, self.client_key = self._leaf("client", "ddprun client", "ca", None, "clientAuth")
        self.wrong_client_cert, self.wrong_client_key = self._leaf("wrong-client", "stranger", "wrong-ca", None,
                                                                   "clientAuth")

    def path(self, name):
        return os.path.join(self.directory, name)

    def _ca(self, name, cn):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
                 "-days", "2", "-subj", f"/CN={cn}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=self.directory)
        return self.path(f"{name}.crt"), self.path(f"{name}.key")

    def _leaf(self, name, cn, ca, sans, usage):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=self.directory)
        ext = self.path(f"{name}.ext")
        with open(ext, "w") as f:
            f.write(f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                    f"extendedKeyUsage={usage}\n")
            if sans:
                f.write(f"subjectAltName={sans}\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=self.directory)
        return self.path(f"{name}.crt"), self.path(f"{name}.key")


class Member:
    """One etcd member: where it listens, where it keeps its data, and its process while it runs."""

    def __init__(self, index, name, address, client_port, peer_port, host, data_dir, log_path):
        self.index = index
        self.name = name
        self.address = address
        self.client_port = client_port
        self.peer_port = peer_port
        self.host = host  # test host number (runs under test-cluster.sh exec), or None: this namespace
        self.data_dir = data_dir
        self.log_path = log_path
        self.proc = None
        self.started = 0

    def endpoint(self):
        return f"{self.address}:{self.client_port}"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


class EtcdCluster:
    """Members on test hosts `hosts` (default 1..3), or `local` members on 127.0.0.1 with free ports. Not
    thread-safe; use from the test's thread. Raises RuntimeError when a member cannot start or the cluster does
    not become healthy within START_TIMEOUT."""

    def __init__(self, directory, hosts=(1, 2, 3), tls=False, v2=True, local=0,
                 heartbeat_ms=100, election_ms=1000):
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.tls = tls
        self.v2 = v2
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.token = f"ddprun-test-{uuid.uuid4().hex[:12]}"
        self.members = []
        for i in range(local or len(hosts)):
            if local:
                address, client, peer, host = "127.0.0.1", _free_port(), _free_port(), None
            else:
                address, client, peer, host = host_address(hosts[i]), CLIENT_PORT, PEER_PORT, hosts[i]
            self.members.append(Member(i, f"m{i + 1}", address, client, peer, host,
                                       os.path.join(self.directory, f"member-{i + 1}.etcd"),
                                       os.path.join(self.directory, f"member-{i + 1}.log")))
        self.scheme = "https" if tls else "http"
        self.certs = Certificates(os.path.join(self.directory, "tls"), [m.address for m in self.members]) \
            if tls else None

    # ---- what clients need ---------------------------------------------------------------------------------
    def endpoints(self):
        """"ADDR:PORT,ADDR:PORT,..." of every member, in member order."""
        return ",".join(m.endpoint() for m in self.members)

    def endpoint(self, i):
        return self.members[i].endpoint()

    def url(self, i):
        return f"{self.scheme}://{self.members[i].endpoint()}"

    @property
    def ca_file(self):
        return self.certs.ca_file

    @property
    def client_cert(self):
        return self.certs.client_cert

    @property
    def client_key(self):
        return self.certs.client_key

    @property
    def wrong_ca_file(self):
        return self.certs.wrong_ca_file

    @property
    def wrong_client_cert(self):
        return self.certs.wrong_client_cert

    @property
    def wrong_client_key(self):
        return self.certs.wrong_client_key

    # ---- life cycle ----------------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout=START_TIMEOUT):
        """Starts every member (a new cluster) and waits until each one is healthy."""
        try:
            for m in self.members:
                self._launch(m, "new")
            deadline = time.monotonic() + timeout
            for m in self.members:
                self._wait_healthy(m, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def start_member(self, i, timeout=START_TIMEOUT):
        """Restarts member i (after kill(i)) with its old data directory; returns once it is healthy."""
        m = self.members[i]
        if m.alive():
            raise RuntimeError(f"etcd member {m.name} ({m.endpoint()}) is already running")
        self._launch(m, "existing")
        self._wait_healthy(m, time.monotonic() + timeout)

    def kill(self, i):
        """SIGKILLs member i and waits until it is gone."""
        m = self.members[i]
        if m.proc is None:
            return
        if m.proc.poll() is None:
            m.proc.send_signal(signal.SIGKILL)
        m.proc.wait(timeout=30)

    def members_alive(self):
        """Indexes of the members whose process runs."""
        return [m.index for m in self.members if m.alive()]

    def stop(self):
        """SIGKILLs every member and anything else running with this cluster's data directories; waits."""
        for m in self.members:
            if m.proc is not None:
                if m.proc.poll() is None:
                    m.proc.send_signal(signal.SIGKILL)
                try:
                    m.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
        deadline = time.monotonic() + 15
        while True:
            left = self.leftover_pids()
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd processes of {self.directory} survive SIGKILL: {left}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def leftover_pids(self):
        """Live processes whose command line names one of this cluster's data directories."""
        needles = [f"--data-dir={m.data_dir}".encode() for m in self.members]
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{entry}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X") and any(n in argv for n in needles):
                found.append(int(entry))
        return found

    def _initial_cluster(self):
        return ",".join(f"{m.name}=http://{m.address}:{m.peer_port}" for m in self.members)

    def _launch(self, m, state):
        args = [ETCD, f"--name={m.name}", f"--data-dir={m.data_dir}",
                f"--listen-client-urls={self.scheme}://{m.address}:{m.client_port}",
                f"--advertise-client-urls={self.scheme}://{m.address}:{m.client_port}",
                f"--listen-peer-urls=http://{m.address}:{m.peer_port}",
                f"--initial-advertise-peer-urls=http://{m.address}:{m.peer_port}",
                f"--initial-cluster={self._initial_cluster()}", f"--initial-cluster-token={self.token}",
                f"--initial-cluster-state={state}", f"--enable-v2={'true' if self.v2 else 'false'}",
                f"--heartbeat-interval={self.heartbeat_ms}", f"--election-timeout={self.election_ms}",
                "--logger=zap", "--log-outputs=stderr"]
        if self.tls:
            cert, key = self.certs.server[m.address]
            args += [f"--cert-file={cert}", f"--key-file={key}", f"--trusted-ca-file={self.certs.ca_file}",
                     "--client-cert-auth"]
        if m.host is not None:
            args = ["bash", CLUSTER, "exec", str(m.host), *args]
        with open(m.log_path, "ab") as log:
            log.write(f"==== {time.strftime('%H:%M:%S')} starting ({state}): {' '.join(args)}\n".encode())
            log.flush()
            m.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        m.started = time.monotonic()

    # ---- queries -------------------------------------------------------------------------------------------
    def _ssl_context(self):
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.certs.ca_file)
        ctx.load_cert_chain(self.certs.client_cert, self.certs.client_key)
        return ctx

    def request(self, i, path, body=None, timeout=2):
        """(status, parsed JSON or text) of GET (body None) or POST `body` (JSON) to member i; raises OSError
        (urllib.error.URLError included) when the member does not answer."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(i) + path, data=data, method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl_context()) as r:
                status, text = r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def healthy(self, i):
        try:
            status, body = self.request(i, "/health")
        except (OSError, ValueError):
            return False
        return status == 200 and isinstance(body, dict) and body.get("health") == "true"

    def _wait_healthy(self, m, deadline):
        while not self.healthy(m.index):
            if m.proc.poll() is not None:
                raise RuntimeError(f"etcd member {m.name} ({m.endpoint()}) exited {m.proc.returncode}:\n"
                                   f"{self.log_tail(m.index)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd member {m.name} ({m.endpoint()}) not healthy in time\n"
                                   f"{self.describe()}")
            time.sleep(0.1)

    def status(self, i):
        """Member i's /v3/maintenance/status as a dict, or None when it does not answer."""
        try:
            code, body = self.request(i, "/v3/maintenance/status", body={})
        except (OSError, ValueError):
            return None
        return body if code == 200 and isinstance(body, dict) else None

    def leader(self, timeout=30):
        """Index of the member that is leader, as the live members agree; waits (at most `timeout` s) while
        there is none (an election in progress). RuntimeError after that."""
        deadline = time.monotonic() + timeout
        while True:
            ids = {}
            leaders = set()
            for m in self.members:
                if not m.alive():
                    continue
                st = self.status(m.index)
                if st and "header" in st:
                    ids[str(st["header"]["member_id"])] = m.index
                    leaders.add(str(st.get("leader", "0")))
            if len(leaders) == 1:
                (lid,) = leaders
                if lid in ids:
                    return ids[lid]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no agreed etcd leader after {timeout} s (members' leaders: {leaders})\n"
                                   f"{self.describe()}")
            time.sleep(0.1)

    def make_leader(self, i, timeout=30):
        """Hands leadership to member i (etcd's transfer-leadership, sent to the current leader); returns once
        the live members agree that i leads. RuntimeError when that does not happen within `timeout` s."""
        deadline = time.monotonic() + timeout
        target = self.status(i)
        if not target:
            raise RuntimeError(f"etcd member m{i + 1} does not answer\n{self.describe()}")
        while True:
            current = self.leader(timeout=max(0.1, deadline - time.monotonic()))
            if current == i:
                return
            try:
                self.request(current, "/v3/maintenance/transfer-leadership",
                             body={"targetID": target["header"]["member_id"]}, timeout=10)
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"member m{i + 1} did not become leader in {timeout} s\n{self.describe()}")
            time.sleep(0.1)

    def wait_leader_other_than(self, old, timeout=30):
        """Waits until the live members agree on a leader that is not member `old`; returns (index, seconds)."""
        began = time.monotonic()
        deadline = began + timeout
        while True:
            try:
                now = self.leader(timeout=max(0.1, deadline - time.monotonic()))
            except RuntimeError:
                now = None
            if now is not None and now != old:
                return now, time.monotonic() - began
            if time.monotonic() > deadline:
                raise RuntimeError(f"no new etcd leader after {timeout} s\n{self.describe()}")
            time.sleep(0.1)

    def log_tail(self, i, chars=3000):
        try:
            with open(self.members[i].log_path, errors="replace") as f:
                return f.read()[-chars:]
        except FileNotFoundError:
            return "(no log)"

    def describe(self):
        return "\n".join(f"--- etcd {m.name} ({m.endpoint()}, {'alive' if m.alive() else 'down'}) log tail ---\n"
                         f"{self.log_tail(m.index, 1500)}" for m in self.members)


def start_local_member(directory, tls=False, v2=True, timeout=START_TIMEOUT):
    """One etcd member on 127.0.0.1 with free client and peer ports, started and healthy (for benchmarks and
    tests that need no hosts). Stop it with .stop() (or use it as a context manager)."""
    return EtcdCluster(directory, tls=tls, v2=v2, local=1).start(timeout)
