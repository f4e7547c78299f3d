#!/usr/bin/python3
"""Interop: PyTorch's own TCPStore client (torch 1.13, Python) against ddprun-store.

    torch_client_vs_ddprun_store.py PATH_TO_DDPRUN_STORE [--ipv6]
    torch_client_vs_ddprun_store.py --reference

Starts `ddprun-store --port 0`, reads the port from its "listening on" line, and drives it with
torch.distributed.TCPStore(is_master=False): every Store method torch 1.13 exposes in Python, PrefixStore,
the world_size "init/" handshake, concurrent clients from several processes, wait wake-ups from another
process and thread, and a real gloo process group (init_process_group with store=..., all_reduce) in two
processes. With --ipv6 the key checks run against [::1] instead of 127.0.0.1 (exit 77 = skipped when the
machine has no IPv6 loopback). The store is always stopped with SIGTERM, and must still be alive before
that and exit 0 after it. --reference runs every check against torch's own TCPStore server instead (in a
child process that mimics ddprun-store's output and SIGTERM handling): it proves that what the checks
expect is torch 1.13's behaviour, not only ours.

Runs under the Python that has torch (Debian: /usr/bin/python3). Exit status 0 only when every check passed.
"""

import datetime
import multiprocessing
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

SKIP = 77
TIMEOUT = datetime.timedelta(seconds=30)
FAILURES = []


def check(name, ok, detail=""):
    print(("ok    " if ok else "FAIL  ") + name + ("" if ok else ": " + detail), flush=True)
    if not ok:
        FAILURES.append(name)


def check_eq(name, got, want):
    check(name, got == want, f"got {got!r}, want {want!r}")


def check_raises(name, fn, exc=RuntimeError):
    try:
        fn()
    except exc as e:  # noqa: PERF203
        check(name, True)
        return e
    check(name, False, f"no {exc.__name__} raised")
    return None


# ---- the store process ----------------------------------------------------------------------------------


# --reference: torch's own server, speaking like ddprun-store on stdout and exiting 0 on SIGTERM.
REFERENCE_SERVER = r"""
import datetime, signal, sys, threading
import torch.distributed as dist
m = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print("ddprun-store listening on [::]:%d" % m.port, flush=True)
stop.wait()
"""


class StoreProcess:
    """ddprun-store on a free port; its output is drained by a thread so the pipe never fills."""

    def __init__(self, command):
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        deadline = time.monotonic() + 30
        self.port = None
        while self.port is None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise RuntimeError("ddprun-store did not report its port within 30 s: " + "".join(self.lines))
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"ddprun-store exited ({self.proc.wait()}) before listening: "
                                   + "".join(self.lines))
            self.lines.append(line)
            if line.startswith("ddprun-store listening on "):
                self.port = int(line.rsplit(":", 1)[1])
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self):
        """SIGTERM; returns (alive before, exit code). Kills it for sure in any case."""
        alive = self.proc.poll() is None
        code = None
        if alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                code = "did not stop within 15 s of SIGTERM"
        else:
            code = self.proc.returncode
        self.drain.join(timeout=5)
        return alive, code


def client(host, port, **kw):
    return dist.TCPStore(host, port, is_master=False, timeout=kw.pop("timeout", TIMEOUT), **kw)


def raw_add(host, port, key, delta):
    """ADD on the raw legacy wire, without torch's "/" prefix: reads keys torch keeps for itself ("init/")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect((host, port))
        k = key.encode()
        s.sendall(b"\x03" + struct.pack("<Q", len(k)) + k + struct.pack("<q", delta))
        reply = b""
        while len(reply) < 8:
            chunk = s.recv(8 - len(reply))
            if not chunk:
                raise RuntimeError("store closed the connection during a raw ADD")
            reply += chunk
        return struct.unpack("<q", reply)[0]


# ---- key checks (also run over IPv6) --------------------------------------------------------------------
# A wait that times out on `s` is only ever on a key nobody sets later (see test_delete_num_keys for why).


def test_set_get(s):
    s.set("str", "hello")
    check_eq("set/get str", s.get("str"), b"hello")
    s.set("utf8", "h\u00e9llo \u2713")
    check_eq("set/get utf-8 str", s.get("utf8"), "h\u00e9llo \u2713".encode())
    s.set("bytes", b"\x00\x01\xfe\xff")
    check_eq("set/get bytes", s.get("bytes"), b"\x00\x01\xfe\xff")
    nul = b"a\x00b\x00\x00c" + bytes(range(256))
    s.set("nul", nul)
    check_eq("set/get binary with NULs", s.get("nul"), nul)
    s.set("empty", "")
    check_eq("set/get empty value", s.get("empty"), b"")
    big = os.urandom(1 << 20)
    s.set("big", big)
    got = s.get("big")
    check("set/get 1 MiB value", got == big, f"got {len(got)} bytes, mismatch")
    s.set("str", "overwritten")
    check_eq("set overwrites", s.get("str"), b"overwritten")


def test_add(s):
    check_eq("add on a new key returns delta", s.add("ctr", 5), 5)
    check_eq("add accumulates", s.add("ctr", 7), 12)
    check_eq("add negative", s.add("ctr", -20), -8)
    check_eq("add 0 reads", s.add("ctr", 0), -8)
    check_eq("add stores ASCII decimal", s.get("ctr"), b"-8")
    check_eq("add 0 on a missing key creates 0", s.add("ctr0", 0), 0)
    s.set("num", "41")
    check_eq("add on a value set as text", s.add("num", 1), 42)
    check_eq("add large", s.add("large", 2**62), 2**62)


def test_compare_set(s):
    check_eq("compare_set missing+empty expected stores desired", s.compare_set("cs1", "", "first"), b"first")
    check_eq("... and the key holds it", s.get("cs1"), b"first")
    n = s.num_keys()
    check_eq("compare_set missing+non-empty expected returns expected", s.compare_set("cs2", "exp", "des"), b"exp")
    check_eq("... and creates no key", s.num_keys(), n)
    check_raises("... wait on it times out", lambda: s.wait(["cs2"], datetime.timedelta(milliseconds=300)))
    check_eq("compare_set present+equal replaces", s.compare_set("cs1", "first", "second"), b"second")
    check_eq("... and the key holds it", s.get("cs1"), b"second")
    check_eq("compare_set present+different returns current", s.compare_set("cs1", "nope", "third"), b"second")
    check_eq("... and keeps it", s.get("cs1"), b"second")
    check_eq("compare_set present+empty expected does not replace", s.compare_set("cs1", "", "x"), b"second")


def test_check_exposed(s):
    # torch 1.13's Python binding has no Store.check (the C++ API has; libtorch_tcpstore_vs_ddprun_store
    # covers it). Newer torch exposes it: test it where it exists.
    if not hasattr(s, "check"):
        print(f"note  Store.check is not exposed in torch {torch.__version__} Python: covered from C++")
        return
    s.set("chk", "1")
    check_eq("check present", s.check(["chk"]), True)
    check_eq("check missing", s.check(["chk", "nochk"]), False)


def test_wait(s, host, port):
    s.set("w1", "1")
    s.set("w2", "2")
    t0 = time.monotonic()
    s.wait(["w1", "w2"])
    s.wait(["w1"], datetime.timedelta(seconds=5))
    check("wait on present keys returns at once", time.monotonic() - t0 < 5)
    for ms in (300, 1000):
        t0 = time.monotonic()
        check_raises(f"wait {ms} ms on a missing key raises", lambda: s.wait(["w1", "missing"],
                                                                             datetime.timedelta(milliseconds=ms)))
        took = time.monotonic() - t0
        check(f"... within bounds ({took:.2f} s)", ms / 1000 * 0.9 <= took <= ms / 1000 + 10, f"{took:.2f} s")
    # The client keeps working after its wait timed out (nothing was pending from the server).
    s.set("after_timeout", "ok")
    check_eq("client usable after a wait timeout", s.get("after_timeout"), b"ok")
    # get() waits too: store timeout applies.
    # torch 1.13 truncates the connect timeout to whole seconds: 1 s is the shortest usable store timeout.
    short = client(host, port, timeout=datetime.timedelta(seconds=1))
    check_raises("get on a missing key times out with the store timeout", lambda: short.get("never"))
    s.set("late", "v")
    check_eq("wait/get see a key set by another client", short.get("late"), b"v")


def test_delete_num_keys(s):
    n0 = s.num_keys()
    s.set("d1", "x")
    s.set("d2", "y")
    check_eq("num_keys counts new keys", s.num_keys(), n0 + 2)
    s.set("d1", "z")
    check_eq("num_keys ignores overwrites", s.num_keys(), n0 + 2)
    check_eq("delete_key present -> True", s.delete_key("d1"), True)
    check_eq("delete_key again -> False", s.delete_key("d1"), False)
    check_eq("delete_key never set -> False", s.delete_key("never_set"), False)
    check_eq("num_keys after delete", s.num_keys(), n0 + 1)
    # A torch 1.13 client abandons a timed-out WAIT without telling the server, which (torch's server too)
    # still answers it once the key appears: that late byte would desynchronise `s`. Use a throwaway client.
    throwaway = client(s.host, s.port)
    check_raises("deleted key is gone (wait times out)",
                 lambda: throwaway.wait(["d1"], datetime.timedelta(milliseconds=300)))
    s.set("d1", "again")
    check_eq("deleted key can be set again", s.get("d1"), b"again")


def test_prefix_store(s):
    outer = dist.PrefixStore("outer", s)
    inner = dist.PrefixStore("inner", outer)
    inner.set("k", "v")
    check_eq("nested PrefixStore key is outer/inner/k", s.get("outer/inner/k"), b"v")
    check_eq("nested PrefixStore get", inner.get("k"), b"v")
    check_eq("outer sees inner/k", outer.get("inner/k"), b"v")
    check_eq("PrefixStore add", inner.add("n", 3), 3)
    check_eq("... visible under the full name", s.add("outer/inner/n", 0), 3)
    check_eq("PrefixStore compare_set", inner.compare_set("cs", "", "a"), b"a")
    check_eq("... visible", s.get("outer/inner/cs"), b"a")
    inner.wait(["k", "n"], datetime.timedelta(seconds=5))
    check("PrefixStore wait on present keys", True)
    check_raises("PrefixStore wait on missing key times out",
                 lambda: inner.wait(["zz"], datetime.timedelta(milliseconds=300)))
    check_eq("PrefixStore delete_key", inner.delete_key("k"), True)
    check_eq("... gone underneath", s.delete_key("outer/inner/k"), False)


def test_world_size_init(host, port):
    before = raw_add(host, port, "init/", 0)
    clients = [client(host, port, world_size=3) for _ in range(3)]
    check_eq("3 clients built with world_size=3 each ADD 1 to 'init/'", raw_add(host, port, "init/", 0), before + 3)
    del clients


def waiter_process(host, port, ready_key, wake_key, result_q):
    try:
        s = client(host, port)
        s.set(ready_key, "1")
        s.wait([wake_key], datetime.timedelta(seconds=60))
        result_q.put(("ok", s.get(wake_key)))
    except Exception as e:  # report to the parent, which checks
        result_q.put(("error", repr(e)))


def test_wait_woken_by_other(s, host, port, ctx):
    q = ctx.Queue()
    p = ctx.Process(target=waiter_process, args=(host, port, "proc_ready", "proc_wake", q))
    p.start()
    try:
        s.wait(["proc_ready"], datetime.timedelta(seconds=60))
        s.set("proc_wake", "from parent")
        status, value = q.get(timeout=60)
        check_eq("wait in another process woken by this client's set", (status, value), ("ok", b"from parent"))
    finally:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join()
    check_eq("waiter process exit code", p.exitcode, 0)

    results = []

    def waiter():
        try:
            c = client(host, port)
            c.set("thr_ready", "1")
            c.wait(["thr_wake"], datetime.timedelta(seconds=60))
            results.append(c.get("thr_wake"))
        except Exception as e:
            results.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    s.wait(["thr_ready"], datetime.timedelta(seconds=60))
    s.set("thr_wake", b"from thread")
    t.join(timeout=90)
    check("waiter thread finished", not t.is_alive())
    check_eq("wait in another thread woken by this client's set", results, [b"from thread"])


def adder_process(host, port, n, result_q):
    try:
        s = client(host, port)
        result_q.put([s.add("shared_counter", 1) for _ in range(n)])
    except Exception as e:
        result_q.put(repr(e))


def test_concurrent_adds(host, port, ctx, nproc=4, n=500):
    q = ctx.Queue()
    procs = [ctx.Process(target=adder_process, args=(host, port, n, q)) for _ in range(nproc)]
    for p in procs:
        p.start()
    try:
        returned = []
        for _ in procs:
            r = q.get(timeout=120)
            check("adder process succeeded", isinstance(r, list), str(r))
            if isinstance(r, list):
                returned += r
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    s = client(host, port)
    total = nproc * n
    check_eq(f"{nproc} processes x {n} adds: exact total", s.add("shared_counter", 0), total)
    check_eq("every add returned a distinct value 1..total", sorted(returned), list(range(1, total + 1)))
    check_eq("adder exit codes", [p.exitcode for p in procs], [0] * nproc)


# ---- a real process group over the store ----------------------------------------------------------------


def gloo_rank(host, port, rank, world, result_q):
    try:
        store = dist.PrefixStore("pg", client(host, port))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
        dist.all_reduce(t)
        gathered = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor([float(rank)]))
        dist.barrier()
        dist.destroy_process_group()
        result_q.put((rank, t.tolist(), [g.item() for g in gathered]))
    except Exception:
        result_q.put((rank, "error", traceback.format_exc()))


def test_gloo_process_group(host, port, ctx, world=2):
    q = ctx.Queue()
    procs = [ctx.Process(target=gloo_rank, args=(host, port, r, world, q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = sorted(q.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    want_sum = [float(sum(range(1, world + 1))), 10.0 * sum(range(1, world + 1))]
    for rank, reduced, gathered in results:
        check_eq(f"gloo rank {rank}: all_reduce over a ddprun-store rendezvous", reduced, want_sum)
        check_eq(f"gloo rank {rank}: all_gather", gathered, [float(r) for r in range(world)])
    check_eq("gloo rank exit codes", [p.exitcode for p in procs], [0] * world)


# ---- main -----------------------------------------------------------------------------------------------


def have_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def main():
    args = sys.argv[1:]
    reference = "--reference" in args
    ipv6 = "--ipv6" in args
    paths = [a for a in args if not a.startswith("--")]
    if (reference and (paths or ipv6)) or (not reference and len(paths) != 1):
        print(__doc__)
        return 2
    command = [sys.executable, "-c", REFERENCE_SERVER] if reference else [paths[0], "--port", "0"]
    if ipv6 and not have_ipv6_loopback():
        print("SKIP: no IPv6 loopback (::1) on this machine")
        return SKIP
    host = "::1" if ipv6 else "127.0.0.1"
    ctx = multiprocessing.get_context("spawn")
    print(f"torch {torch.__version__}, client host {host}" + (", REFERENCE: torch's own server" if reference else ""))

    store = StoreProcess(command)
    t_start = time.monotonic()
    try:
        print(f"{'torch server' if reference else 'ddprun-store'} on port {store.port}")
        s = client(host, store.port)
        steps = [
            ("set/get", lambda: test_set_get(s)),
            ("add", lambda: test_add(s)),
            ("compare_set", lambda: test_compare_set(s)),
            ("check", lambda: test_check_exposed(s)),
            ("wait", lambda: test_wait(s, host, store.port)),
            ("delete_key/num_keys", lambda: test_delete_num_keys(s)),
            ("PrefixStore", lambda: test_prefix_store(s)),
            ("world_size init/", lambda: test_world_size_init(host, store.port)),
            ("wait woken by others", lambda: test_wait_woken_by_other(s, host, store.port, ctx)),
            ("concurrent adds", lambda: test_concurrent_adds(host, store.port, ctx)),
        ]
        if not ipv6:
            steps.append(("gloo process group", lambda: test_gloo_process_group(host, store.port, ctx)))
        for name, fn in steps:
            t0 = time.monotonic()
            try:
                fn()
            except Exception:
                check(f"{name}: no unexpected exception", False, traceback.format_exc())
            print(f"--    {name}: {time.monotonic() - t0:.2f} s", flush=True)
    finally:
        alive, code = store.stop()
        check("ddprun-store still alive at the end (did not crash)", alive, f"exit code {code}")
        check_eq("ddprun-store exits 0 on SIGTERM", code, 0)
        if FAILURES:
            print("---- ddprun-store output ----\n" + "".join(store.lines))
    print(f"{len(FAILURES)} failure(s) in {time.monotonic() - t_start:.1f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
