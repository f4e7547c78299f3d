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
import multiprocessing
import os
import re
import sys
import time
import traceback

import torch
import torch.distributed as dist

from store_check_common import FAILURES, TORCH, check, check_eq, check_raises, client, has_op, note, woken_by
from store_wire_trace import RawStore, RecordingProxy
from torch_store_group_checks import (test_concurrent_adds, test_gloo_process_group, test_wait_woken_by_other,
                                      test_worker_keyspaces)

DIALECT = None  # the wire dialect this torch's clients speak, as the proxy saw it ("legacy" / "modern")



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
    ctx.set_forkserver_preload(["torch", "torch.distributed", "store_wire_trace", "torch_store_group_checks"])
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