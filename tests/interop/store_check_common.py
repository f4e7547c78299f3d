"""What the store interop checks share: the check/report functions, the failure list, this torch's
version and a TCPStore client with the checks' timeout. Imported by torch_store_checks.py and
torch_store_group_checks.py (and by the helper processes they start)."""

import datetime
import re
import threading

import torch
import torch.distributed as dist

TORCH = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
TIMEOUT = datetime.timedelta(seconds=30)
FAILURES = []
# The Store methods torch 2.6's Python API has beyond 1.13's. Torch 2.6 (and later) must have every one: a
# missing one fails the run rather than skipping its checks.
EXTENDED_API = ("check", "append", "multi_get", "multi_set")



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

