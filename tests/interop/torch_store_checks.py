#!/usr/bin/python3
"""The torch side of the store interop checks: PyTorch's own TCPStore client (Python) against a running store.

    torch_store_checks.py PHASE HOST PORT [--reference] [--expect-torch X.Y]

Run by torch_client_vs_ddprun_store.py (the driver, which starts and stops the store and documents the
phases) with the interpreter whose torch is tested: /usr/bin/python3 (torch 1.13) or scripts/torch26-python
(torch 2.6, in its Debian 13 root). PHASE is "main" or "keyspaces". Prints one line per check ("ok    ..." /
"FAIL  ...: detail"); exit status 0 only when every check passed. Torch's Python API has no queue operations
(QUEUE_PUSH/POP/LEN) up to 2.6: they are covered from C++.
"""

import datetime
import faulthandler
import multiprocessing
import os
import queue
import re
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from store_wire_trace import RawStore, RecordingProxy

TORCH = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
TIMEOUT = datetime.timedelta(seconds=30)
FAILURES = []
# The Store methods torch 2.6's Python API has beyond 1.13's. Torch 2.6 (and later) must have every one: a
# missing one fails the run rather than skipping its checks.
EXTENDED_API = ("check", "append", "multi_get", "multi_set")
DIALECT = None  # the wire dialect this torch's clients speak, as the proxy saw it ("legacy" / "modern")


def check(name, ok, detail=""):
    print(("ok    " if ok else "FAIL  ") + name + ("" if ok else ": " + detail), flush=True)
    if not ok:
        FAILURES.append(name)


def check_eq(name, got, want):
    check(name, got == want, f"got {got!r}, want {want!r}")


def check_raises(name, fn, exc=RuntimeError):
    try:
        fn()
    except exc:  # noqa: PERF203
        check(name, True)
        return
    check(name, False, f"no {exc.__name__} raised")


def note(text):
    print("note  " + text, flush=True)


def has_op(store, op):
    """Whether this torch's Python Store has method `op` (one of EXTENDED_API). Torch >= 2.6 must have it."""
    if hasattr(store, op):
        return True
    if TORCH >= (2, 6):
        check(f"Store.{op} exists in torch {torch.__version__}", False, "missing from the Python API")
    else:
        note(f"Store.{op} is not exposed in torch {torch.__version__}'s Python API: its checks are skipped")
    return False


def client(host, port, **kw):
    return dist.TCPStore(host, port, is_master=False, timeout=kw.pop("timeout", TIMEOUT), **kw)


def woken_by(host, port, key, write, what):
    """A client in another thread waits for `key`; `write()` (on another client) must wake it, and the waiter
    must then read what write() stored (returned for the caller to check)."""
    results = []
    ready = f"{key}_ready"

    def waiter():
        try:
            c = client(host, port)
            c.set(ready, "1")
            c.wait([key], datetime.timedelta(seconds=60))
            results.append(c.get(key))
        except Exception as e:  # reported below
            results.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    c = client(host, port)
    c.wait([ready], datetime.timedelta(seconds=60))
    write()
    t.join(timeout=90)
    check(f"{what}: the waiter woke", not t.is_alive() and len(results) == 1 and isinstance(results[0], bytes),
          f"alive={t.is_alive()}, results={results!r}")
    return results[0] if results and isinstance(results[0], bytes) else None


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


def test_check(s):
    # torch 1.13's Python binding has no Store.check (the C++ API has; libtorch_tcpstore_vs_ddprun_store
    # covers it).
    if not has_op(s, "check"):
        return
    s.set("chk", "1")
    check_eq("check present", s.check(["chk"]), True)
    check_eq("check missing", s.check(["chk", "nochk"]), False)
    check_eq("check of no keys", s.check([]), True)
    n = s.num_keys()
    check_eq("check creates nothing", (s.check(["nochk"]), s.num_keys()), (False, n))


def test_append(s, host, port):
    if not has_op(s, "append"):
        return
    n = s.num_keys()
    s.append("ap", "a")
    check_eq("append on a missing key creates it", s.get("ap"), b"a")
    s.append("ap", b"\x00\xff")
    s.append("ap", "")
    s.append("ap", "z")
    check_eq("append concatenates (binary, empty)", s.get("ap"), b"a\x00\xffz")
    check_eq("... one new key", s.num_keys(), n + 1)
    s.set("ap", "reset")
    s.append("ap", "!")
    check_eq("append after set", s.get("ap"), b"reset!")
    check_eq("append on an ADD counter keeps ASCII", (s.add("ap_ctr", 4), s.append("ap_ctr", "2"), s.add("ap_ctr", 1)),
             (4, None, 43))
    got = woken_by(host, port, "ap_wake", lambda: client(host, port).append("ap_wake", "appended"),
                   "append creating a key")
    check_eq("... and the waiter reads the appended value", got, b"appended")


def test_multi(s, host, port):
    if not (has_op(s, "multi_set") and has_op(s, "multi_get")):
        return
    n = s.num_keys()
    s.multi_set(["m1", "m2", "m3"], ["one", b"\x00\xff", ""])
    check_eq("multi_set/multi_get", s.multi_get(["m1", "m2", "m3"]), [b"one", b"\x00\xff", b""])
    check_eq("... three new keys", s.num_keys(), n + 3)
    check_eq("... get sees multi_set's value", s.get("m2"), b"\x00\xff")
    check_eq("multi_get keeps order and repeats", s.multi_get(["m3", "m1", "m1"]), [b"", b"one", b"one"])
    check_eq("multi_get of no keys", s.multi_get([]), [])
    s.multi_set(["m1", "m4"], ["uno", "four"])
    check_eq("multi_set overwrites and adds", s.multi_get(["m1", "m4"]), [b"uno", b"four"])
    big = [os.urandom(1 << 20), os.urandom(1 << 20)]
    s.multi_set(["mbig0", "mbig1"], big)
    check("multi_set/multi_get two 1 MiB values", s.multi_get(["mbig0", "mbig1"]) == big, "mismatch")
    s.multi_set(["m_dup", "m_dup"], ["first", "second"])
    check_eq("multi_set of one key twice: the last wins", s.get("m_dup"), b"second")
    short = client(host, port, timeout=datetime.timedelta(seconds=1))
    t0 = time.monotonic()
    check_raises("multi_get with a missing key times out with the store timeout",
                 lambda: short.multi_get(["m1", "m_never"]))
    check("... after about 1 s", 0.9 <= time.monotonic() - t0 <= 11, f"{time.monotonic() - t0:.2f} s")
    got = woken_by(host, port, "m_wake", lambda: client(host, port).multi_set(["m_other", "m_wake"], ["o", "w"]),
                   "multi_set of a waited key")
    check_eq("... and the waiter reads it", got, b"w")


def test_wait_cancel(s, host, port):
    """A modern client cancels a timed-out wait (CANCEL_WAIT): when the key appears later, the store must not
    answer the forgotten wait, or the client's next replies would be shifted by one byte."""
    if DIALECT != "modern":
        note(f"torch {torch.__version__} clients do not cancel waits ({DIALECT} dialect): skipped")
        return
    check_raises("wait 300 ms on a missing key raises", lambda: s.wait(["cancelled"], datetime.timedelta(milliseconds=300)))
    client(host, port).set("cancelled", "now")
    check_eq("the key of a cancelled wait set later: the client's next get is right", s.get("cancelled"), b"now")
    check_eq("... and its next add", s.add("after_cancel", 2), 2)
    for _ in range(3):
        check_raises("repeated wait timeouts on one connection",
                     lambda: s.wait(["cancelled", "never_a"], datetime.timedelta(milliseconds=200)))
    check_eq("... leave it usable", s.get("str"), b"overwritten")


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
    if has_op(inner, "multi_set") and has_op(inner, "multi_get"):
        inner.multi_set(["ma", "mb"], ["1", "2"])
        check_eq("PrefixStore multi_set is prefixed", s.get("outer/inner/mb"), b"2")
        check_eq("PrefixStore multi_get", inner.multi_get(["mb", "ma"]), [b"2", b"1"])
    if has_op(inner, "append"):
        inner.append("ap", "x")
        inner.append("ap", "y")
        check_eq("PrefixStore append is prefixed", s.get("outer/inner/ap"), b"xy")
    if has_op(inner, "check"):
        check_eq("PrefixStore check", (inner.check(["ma", "ap"]), inner.check(["ma", "k"])), (True, False))


def test_world_size_init(host, port):
    # "init/" has no "/" in front: out of reach of torch's Python API, read it on a raw connection.
    with RawStore(host, port, DIALECT) as raw:
        before = raw.add("init/", 0)
        clients = [client(host, port, world_size=3) for _ in range(3)]
        check_eq("3 clients built with world_size=3 each ADD 1 to 'init/'", raw.add("init/", 0), before + 3)
    del clients


def test_wire_requests(proxy):
    """What torch put on the wire during the checks above (every client went through `proxy`)."""
    used = [(d, ops) for d, ops in proxy.connections() if ops]
    dialects = {d for d, _ in used}
    seen = {op for _, ops in used for op in ops}
    note(f"{len(used)} connections, dialects {sorted(dialects)}, requests seen: {' '.join(sorted(seen))}")
    if TORCH >= (2, 6):
        check_eq("every torch connection speaks the modern dialect", dialects, {"modern"})
        bad = [ops[:3] for _, ops in used if ops[:2] != ["VALIDATE", "PING"]]
        check("every connection opens with VALIDATE then PING", not bad, f"openings {bad[:5]}")
        want = {"SET", "GET", "ADD", "COMPARE_SET", "CHECK", "WAIT", "CANCEL_WAIT", "GETNUMKEYS", "DELETE_KEY",
                "APPEND", "MULTI_GET", "MULTI_SET"}
    elif TORCH < (2, 1):
        check_eq("every torch connection speaks the legacy dialect", dialects, {"legacy"})
        want = {"SET", "GET", "ADD", "COMPARE_SET", "WAIT", "GETNUMKEYS", "DELETE_KEY"}
    else:
        note(f"no wire expectations for torch {torch.__version__} (verified: 1.13 legacy, 2.6 modern)")
        want = set()
    check(f"torch {torch.__version__} sent every request the checks exercise", want <= seen,
          f"never sent: {sorted(want - seen)}")


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


# ---- worker keyspaces (ddprun-store only) ---------------------------------------------------------------


def keyspace_round(host, port, agent, old):
    """Opens keyspace "job/r1", checks it from clients connected after the switch, opens "job/r2", and returns
    (the store's key count, how many of them are r1's) taken while r1's clients are still connected; they are
    closed when it returns."""
    agent.set("ddprun/worker_keyspace", "job/r1")  # the wire key "/ddprun/worker_keyspace": the agents' namespace
    new1 = client(host, port)
    check_eq("a client connected after the switch does not see the old key (compare_set creates it)",
             new1.compare_set("ks/k", "", "attempt 1"), b"attempt 1")
    check_eq("... its counter starts afresh", new1.add("ks/n", 1), 1)
    check_eq("the client connected before still sees its own key", old.get("ks/k"), b"attempt 0")
    check_eq("... and its own counter", old.add("ks/n", 0), 5)
    new2 = client(host, port)
    check_eq("a second client connected after the switch shares the new keyspace", new2.get("ks/k"), b"attempt 1")
    check_eq("... and its counter", new2.add("ks/n", 0), 1)
    check_eq("num_keys of the new keyspace counts its own keys only", new2.num_keys(), 2)
    old.set("ks/only_old", "x")
    # The wait times out on a key no client of new2's keyspace ever sets: no late reply can confuse new2 (1.13).
    check_raises("a key set in the old keyspace is invisible in the new one",
                 lambda: new2.wait(["ks/only_old"], datetime.timedelta(milliseconds=300)))
    got = woken_by(host, port, "ks/wake", lambda: new1.set("ks/wake", "r1"), "a wait in the new keyspace")
    check_eq("... reads the new keyspace's value", got, b"r1")
    check_eq("delete_key in the new keyspace", new1.delete_key("ks/k"), True)
    check_eq("... leaves the old keyspace's key", old.get("ks/k"), b"attempt 0")
    new1.set("ks/k", "attempt 1 again")
    check_eq("the agents' namespace is shared by both keyspaces",
             (old.get("ddprun/worker_keyspace"), new1.get("ddprun/worker_keyspace")), (b"job/r1", b"job/r1"))
    inner = dist.PrefixStore("pg", new2)
    inner.set("0", "addr of rank 0, attempt 1")
    old_inner = dist.PrefixStore("pg", old)
    old_inner.set("0", "addr of rank 0, attempt 0")
    check_eq("PrefixStore keys are scoped too (as init_process_group's)",
             (inner.get("0"), old_inner.get("0")), (b"addr of rank 0, attempt 1", b"addr of rank 0, attempt 0"))
    if has_op(new1, "multi_set") and has_op(new1, "multi_get") and has_op(old, "check"):
        new1.multi_set(["ks/m1", "ks/m2"], ["a", "b"])
        check_eq("multi_set in the new keyspace: multi_get there", new2.multi_get(["ks/m1", "ks/m2"]), [b"a", b"b"])
        check_eq("... check in the old one", (old.check(["ks/m1"]), new2.check(["ks/m1", "ks/k"])), (False, True))
    if has_op(new1, "append"):
        new2.append("ks/ap", "new")
        old.append("ks/ap", "old")
        check_eq("append is scoped", (new1.get("ks/ap"), old.get("ks/ap")), (b"new", b"old"))

    agent.set("ddprun/worker_keyspace", "job/r2")
    new3 = client(host, port)
    check_eq("the next attempt's client sees none of r1's keys", new3.add("ks/n", 0), 0)
    check_eq("a client of r1 still sees r1's keys after the next switch", new1.get("ks/k"), b"attempt 1 again")
    check_eq("... and the client of the very first keyspace its own", old.get("ks/k"), b"attempt 0")
    return agent.num_keys(), new1.num_keys()


def test_worker_keyspaces(host, port):
    agent = client(host, port)  # names only /ddprun/ keys: never bound to a keyspace, its num_keys counts all
    old = client(host, port)
    old.set("ks/k", "attempt 0")  # binds `old` to the store as it is: no keyspace was ever opened
    old.add("ks/n", 5)
    total, r1_keys = keyspace_round(host, port, agent, old)
    # The r1 clients are closed now (keyspace_round returned); r1 is not current: its keys must go.
    check("r1 holds keys while its clients are connected", r1_keys > 0, f"{r1_keys} keys")
    deadline = time.monotonic() + 30
    while agent.num_keys() != total - r1_keys and time.monotonic() < deadline:
        time.sleep(0.05)
    check_eq(f"r1's {r1_keys} keys erased once its last client closed", agent.num_keys(), total - r1_keys)
    check_eq("the keys of the first client stay", old.get("ks/k"), b"attempt 0")


# ---- a real process group over the store ----------------------------------------------------------------


def gloo_rank(host, port, rank, world, result_q):
    faulthandler.dump_traceback_later(100)  # a rank stuck past the group's 60 s timeout shows where, on stderr
    try:
        store = dist.PrefixStore("pg", client(host, port))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
        dist.all_reduce(t)
        gathered = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor([float(rank)]))
        dist.barrier()
        result_q.put((rank, t.tolist(), [g.item() for g in gathered]))
    except Exception:
        result_q.put((rank, "error", traceback.format_exc()))
        return
    # No destroy_process_group(): torch 2.6's gloo destructor joins its worker threads while holding the GIL,
    # and a worker that needs the GIL deadlocks it (pytorch#154976, fixed after 2.6; seen here in 2 of 4 runs
    # on a busy machine). Nothing of the store is involved: leave without running destructors.
    result_q.close()
    result_q.join_thread()
    os._exit(0)


def test_gloo_process_group(host, port, ctx, world=2):
    q = ctx.Queue()
    procs = [ctx.Process(target=gloo_rank, args=(host, port, r, world, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in procs:
            results.append(q.get(timeout=120))
    except queue.Empty:
        check("every gloo rank reported within 120 s", False,
              f"reported: {sorted(r[0] for r in results)}; see the stack dump of the missing rank above")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    want_sum = [float(sum(range(1, world + 1))), 10.0 * sum(range(1, world + 1))]
    for rank, reduced, gathered in sorted(results):
        check_eq(f"gloo rank {rank}: all_reduce over a ddprun-store rendezvous", reduced, want_sum)
        check_eq(f"gloo rank {rank}: all_gather", gathered, [float(r) for r in range(world)])
    check_eq("gloo rank exit codes", [p.exitcode for p in procs], [0] * world)


# ---- main -----------------------------------------------------------------------------------------------


def run_steps(steps):
    for name, fn in steps:
        t0 = time.monotonic()
        try:
            fn()
        except Exception:
            check(f"{name}: no unexpected exception", False, traceback.format_exc())
        print(f"--    {name}: {time.monotonic() - t0:.2f} s", flush=True)


def main_checks(host, store_port, ipv6):
    global DIALECT
    # The helper processes (waiters, adders, gloo ranks) start from a fork server that imported torch once:
    # fresh single-threaded processes as with "spawn", without an import of torch each (seconds apiece).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "store_wire_trace"])
    proxy = RecordingProxy(host, store_port)
    port = proxy.port
    s = client(host, port)
    s.add("first", 1)  # a request with a reply: the proxy has recorded it once add() returns
    DIALECT = next((d for d, ops in proxy.connections() if ops), None)
    if DIALECT is None:
        raise RuntimeError("the proxy saw no request from the first client")
    note(f"torch's clients speak the {DIALECT} dialect")
    steps = [
        ("set/get", lambda: test_set_get(s)),
        ("add", lambda: test_add(s)),
        ("compare_set", lambda: test_compare_set(s)),
        ("check", lambda: test_check(s)),
        ("append", lambda: test_append(s, host, port)),
        ("multi_get/multi_set", lambda: test_multi(s, host, port)),
        ("wait", lambda: test_wait(s, host, port)),
        ("wait cancel", lambda: test_wait_cancel(s, host, port)),
        ("delete_key/num_keys", lambda: test_delete_num_keys(s)),
        ("PrefixStore", lambda: test_prefix_store(s)),
        ("world_size init/", lambda: test_world_size_init(host, port)),
        ("wait woken by others", lambda: test_wait_woken_by_other(s, host, port, ctx)),
        ("concurrent adds", lambda: test_concurrent_adds(host, port, ctx)),
    ]
    if not ipv6:
        steps.append(("gloo process group", lambda: test_gloo_process_group(host, port, ctx)))
    steps.append(("requests on the wire", lambda: test_wire_requests(proxy)))
    run_steps(steps)
    proxy.close()


def main():
    args = sys.argv[1:]
    if len(args) < 3:
        print(__doc__)
        return 2
    phase, host, port = args[:3]
    reference = "--reference" in args
    expect = args[args.index("--expect-torch") + 1] if "--expect-torch" in args else None
    t_start = time.monotonic()
    print(f"torch {torch.__version__} ({sys.executable}), phase {phase}, client host {host}"
          + (", REFERENCE: torch's own server" if reference else ""), flush=True)
    if expect:
        check(f"torch is version {expect}", re.match(re.escape(expect) + r"(\.|$)", torch.__version__) is not None,
              f"torch {torch.__version__}")
    if phase == "main":
        main_checks(host, int(port), ":" in host)
    elif phase == "keyspaces":
        run_steps([("worker keyspaces", lambda: test_worker_keyspaces(host, int(port)))])
    else:
        check(f"known phase '{phase}'", False)
    print(f"{len(FAILURES)} failure(s) in {time.monotonic() - t_start:.1f} s", flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
