#!/usr/bin/python3
"""Interop: ddprun's StoreClient (legacy dialect, C++) against PyTorch 1.13's own TCPStore server.

    run_client_vs_torch_store.py PATH_TO_ddprun_client_vs_torch_store

Starts a torch TCPStore master (TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)) in a
child process, which reports its port on stdout and lives until its stdin closes. Seeds keys with a torch
client, runs the C++ program against the server, then checks from a torch client that the keys the C++
program wrote are there under the same names with the same bytes, and that the server is still healthy.

Runs under the Python that has torch (Debian: /usr/bin/python3). Exit status 0 only when every check passed.
"""

import datetime
import select
import subprocess
import sys
import time

import torch.distributed as dist

FAILURES = []
TIMEOUT = datetime.timedelta(seconds=10)

# The torch server, run by the same interpreter: prints its port, serves until stdin is closed.
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


def start_server():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
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


def seed(s):
    s.set("py/str", "from torch")
    s.set("py/bin", b"\x00\xffz\x00")
    s.add("py/counter", 7)
    dist.PrefixStore("py_inner", dist.PrefixStore("py_outer", s)).set("k", "nested from torch")


def absent(host, port, key):
    """True when `key` does not exist. A throwaway client: a timed-out 1.13 wait poisons its connection."""
    c = dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT)
    try:
        c.wait([key], datetime.timedelta(milliseconds=200))
        return False
    except RuntimeError:
        return True


def verify(s, host, port):
    check_eq("torch sees cpp/str", s.get("cpp/str"), b"from ddprun")
    check_eq("torch sees cpp/bin (NULs kept)", s.get("cpp/bin"), b"a\x00b\x00\x00\xff")
    check_eq("torch sees cpp/empty", s.get("cpp/empty"), b"")
    check_eq("torch sees the 1 MiB cpp/big", s.get("cpp/big"), big_value())
    check_eq("torch sees cpp/over overwritten", s.get("cpp/over"), b"two")
    check_eq("torch reads cpp/counter with add 0", s.add("cpp/counter", 0), 42)
    check_eq("torch sees cpp/n as ASCII decimal", s.get("cpp/n"), b"-3")
    check_eq("torch sees compare_set result cpp/cs", s.get("cpp/cs"), b"second")
    check_eq("torch sees cpp/late (set after the reconnect)", s.get("cpp/late"), b"here")
    check_eq("torch sees cpp/wake", s.get("cpp/wake"), b"awake")
    check_eq("torch sees cpp/d2", s.get("cpp/d2"), b"y")
    check("cpp/d1 deleted by ddprun is absent for torch", absent(host, port, "cpp/d1"))
    check("cpp/cs_none was never created", absent(host, port, "cpp/cs_none"))
    check("modern-only ops left no cpp/a", absent(host, port, "cpp/a"))
    inner = dist.PrefixStore("cpp_inner", dist.PrefixStore("cpp_outer", s))
    check_eq("torch's nested PrefixStore reads ddprun's nested PrefixStore key", inner.get("k"),
             b"nested from ddprun")
    check_eq("... and its add", inner.add("n", 0), 3)
    check_eq("torch's counter py/counter unchanged by ddprun's add 0", s.add("py/counter", 0), 7)
    s.set("py/after", "still serving")
    check_eq("torch server still serves after the C++ client left", s.get("py/after"), b"still serving")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    program = sys.argv[1]
    host = "127.0.0.1"
    t_start = time.monotonic()
    server, port = start_server()
    try:
        print(f"torch TCPStore server on port {port}")
        s = dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT)
        seed(s)
        t0 = time.monotonic()
        try:
            run = subprocess.run([program, host, str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=240)
            print(run.stdout, end="")
            check_eq(f"C++ program exit code ({time.monotonic() - t0:.2f} s)", run.returncode, 0)
        except subprocess.TimeoutExpired as e:
            print(e.stdout or "")
            check("C++ program finished within 240 s", False)
        verify(s, host, port)
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
