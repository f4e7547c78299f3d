#!/usr/bin/python3
"""Interop: ddprun's StoreClient (C++) against PyTorch's own TCPStore server (torch 1.13, or 2.6 through
scripts/torch26-python).

    run_client_vs_torch_store.py PATH_TO_ddprun_client_vs_torch_store [--python INTERP] [--expect-torch X.Y]
                                 [--dialect legacy|modern]

A driver that needs no torch: INTERP (default: this interpreter) runs everything that is torch — the server
(TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) in a child that reports its port on stdout
and lives until its stdin closes), and a torch client that seeds keys before the C++ program runs and checks
afterwards that the keys the C++ program wrote are there under the same names with the same bytes, and that
the server is still healthy. The C++ program runs here, on this machine's libraries, with the dialect given:
legacy (the default) for torch 1.13's server, modern for torch 2.x's (then it also checks APPEND, MULTI_GET,
MULTI_SET, PING and CANCEL_WAIT against torch's server, and the torch client reads what they wrote).
--expect-torch X.Y fails the run unless INTERP's torch is version X.Y.

Exit status 0 only when every check passed.
"""

import datetime
import os
import re
import select
import subprocess
import sys
import time

FAILURES = []
TIMEOUT = datetime.timedelta(seconds=10)
TORCH_SIDE_TIMEOUT = 180  # seconds for one torch client process (torch 2.6 in its root imports slowly)

# The torch server, run by INTERP: prints its port, serves until stdin is closed.
SERVER = r"""
import datetime, sys
import torch.distributed as dist
m = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
print("port", m.port, flush=True)
sys.stdin.read()
"""


def check(name, ok, detail=""):
    print(("ok    " if ok else "FAIL  ") + name + ("" if ok else ": " + detail), flush=True)
    if not ok:
        FAILURES.append(name)


def check_eq(name, got, want):
    shown = (lambda v: v if not isinstance(v, bytes) or len(v) < 80 else v[:40] + b"...")
    check(name, got == want, f"got {shown(got)!r}, want {shown(want)!r}")


def big_value():
    """The C++ program's 1 MiB value: byte i = (31 i + 7) mod 256."""
    return bytes((i * 31 + 7) & 0xFF for i in range(1 << 20))


# ---- the torch side (run by INTERP: `--torch-side seed|verify HOST PORT DIALECT [--expect-torch X.Y]`) ------


def seed(dist, s):
    s.set("py/str", "from torch")
    s.set("py/bin", b"\x00\xffz\x00")
    s.add("py/counter", 7)
    dist.PrefixStore("py_inner", dist.PrefixStore("py_outer", s)).set("k", "nested from torch")


def absent(dist, host, port, key):
    """True when `key` does not exist. A throwaway client: a timed-out 1.13 wait poisons its connection."""
    c = dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT)
    try:
        c.wait([key], datetime.timedelta(milliseconds=200))
        return False
    except RuntimeError:
        return True


def verify(dist, s, host, port, dialect):
    check_eq("torch sees cpp/str", s.get("cpp/str"), b"from ddprun")
    check_eq("torch sees cpp/bin (NULs kept)", s.get("cpp/bin"), b"a\x00b\x00\x00\xff")
    check_eq("torch sees cpp/empty", s.get("cpp/empty"), b"")
    check_eq("torch sees the 1 MiB cpp/big", s.get("cpp/big"), big_value())
    check_eq("torch sees cpp/over overwritten", s.get("cpp/over"), b"two")
    check_eq("torch reads cpp/counter with add 0", s.add("cpp/counter", 0), 42)
    check_eq("torch sees cpp/n as ASCII decimal", s.get("cpp/n"), b"-3")
    check_eq("torch sees compare_set result cpp/cs", s.get("cpp/cs"), b"second")
    check_eq("torch sees cpp/late (set after the wait timeout)", s.get("cpp/late"), b"here")
    check_eq("torch sees cpp/wake", s.get("cpp/wake"), b"awake")
    check_eq("torch sees cpp/d2", s.get("cpp/d2"), b"y")
    check("cpp/d1 deleted by ddprun is absent for torch", absent(dist, host, port, "cpp/d1"))
    check("cpp/cs_none was never created", absent(dist, host, port, "cpp/cs_none"))
    if dialect == "modern":
        check_eq("torch sees cpp/a appended by ddprun", s.get("cpp/a"), b"x\x00y")
        check_eq("torch reads ddprun's multi_set with get", s.get("cpp/m2"), b"\x00two")
        if hasattr(s, "multi_get"):
            check_eq("torch's multi_get reads ddprun's multi_set", s.multi_get(["cpp/m1", "cpp/m2", "cpp/m3"]),
                     [b"one", b"\x00two", b""])
        check_eq("torch sees cpp/after_cancel (set after a cancelled wait)", s.get("cpp/after_cancel"), b"ok")
    else:
        check("modern-only ops left no cpp/a", absent(dist, host, port, "cpp/a"))
    inner = dist.PrefixStore("cpp_inner", dist.PrefixStore("cpp_outer", s))
    check_eq("torch's nested PrefixStore reads ddprun's nested PrefixStore key", inner.get("k"),
             b"nested from ddprun")
    check_eq("... and its add", inner.add("n", 0), 3)
    check_eq("torch's counter py/counter unchanged by ddprun's add 0", s.add("py/counter", 0), 7)
    s.set("py/after", "still serving")
    check_eq("torch server still serves after the C++ client left", s.get("py/after"), b"still serving")


def torch_side(args):
    import torch
    import torch.distributed as dist

    what, host, port, dialect = args[1:5]
    port = int(port)
    if "--expect-torch" in args:
        want = args[args.index("--expect-torch") + 1]
        check(f"torch is version {want}", re.match(re.escape(want) + r"(\.|$)", torch.__version__) is not None,
              f"torch {torch.__version__}")
    s = dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT)
    if what == "seed":
        seed(dist, s)
    else:
        verify(dist, s, host, port, dialect)
    return 1 if FAILURES else 0


# ---- the driver ---------------------------------------------------------------------------------------------


def start_server(python):
    proc = subprocess.Popen([python, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if not select.select([proc.stdout], [], [], 60)[0]:
        proc.kill()
        proc.wait()
        raise RuntimeError("the torch TCPStore server did not report its port within 60 s")
    line = proc.stdout.readline()
    if not line.startswith("port "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"unexpected output from the torch server: {line!r}")
    return proc, int(line.split()[1])


def run(name, command, timeout):
    """Runs `command` (its output goes to ours); a check that it exits 0 within `timeout` s."""
    t0 = time.monotonic()
    try:
        rc = subprocess.run(command, stdin=subprocess.DEVNULL, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = f"killed after {timeout} s"
    check(f"{name} ({time.monotonic() - t0:.2f} s)", rc == 0, f"exit status {rc}")


def value_of(args, flag, default):
    if flag not in args:
        return default
    i = args.index(flag)
    if i + 1 >= len(args):
        raise SystemExit(f"{flag} needs a value")
    del args[i]
    return args.pop(i)


def main():
    args = sys.argv[1:]
    if args and args[0] == "--torch-side":
        return torch_side(args)
    python = value_of(args, "--python", sys.executable)
    expect = value_of(args, "--expect-torch", None)
    dialect = value_of(args, "--dialect", "legacy")
    if len(args) != 1 or args[0].startswith("--") or dialect not in ("legacy", "modern"):
        print(__doc__)
        return 2
    program = args[0]
    host = "127.0.0.1"
    t_start = time.monotonic()
    server, port = start_server(python)
    try:
        print(f"torch TCPStore server (run by {python}) on port {port}; ddprun client dialect {dialect}", flush=True)
        side = [python, os.path.abspath(__file__), "--torch-side"]
        tail = [host, str(port), dialect] + (["--expect-torch", expect] if expect else [])
        run("torch client seeded its keys", side + ["seed"] + tail, TORCH_SIDE_TIMEOUT)
        run("C++ program: every check passed", [program, host, str(port), "--dialect", dialect], 240)
        run("torch client: every check of the C++ program's keys passed", side + ["verify"] + tail,
            TORCH_SIDE_TIMEOUT)
        check("torch server still alive", server.poll() is None, f"exit code {server.returncode}")
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    print(f"{len(FAILURES)} failure(s) in {time.monotonic() - t_start:.1f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
