#!/usr/bin/python3
"""Interop: PyTorch's own TCPStore client (Python; torch 1.13, or 2.6 through scripts/torch26-python) against
ddprun-store.

    torch_client_vs_ddprun_store.py PATH_TO_DDPRUN_STORE [--ipv6] [--python INTERP] [--expect-torch X.Y]
    torch_client_vs_ddprun_store.py --reference [--python INTERP] [--expect-torch X.Y]

This script is a driver that needs no torch: it starts the store here (ddprun-store is linked against this
machine's libraries, so it never runs inside the torch 2.6 root), reads the port from its "listening on" line,
and runs the checks in a child `INTERP torch_store_checks.py PHASE HOST PORT`, INTERP being the Python whose
torch is tested (default: the driver's own). Each phase gets a fresh store:
  main       every Store method the torch version exposes (torch 2.6 adds check, append, multi_get, multi_set;
             torch 2.6 must have them, older versions test what they have), PrefixStore, the world_size
             "init/" handshake, concurrent clients from several processes, wait wake-ups from another process
             and thread, a real gloo process group (init_process_group with store=..., all_reduce) in two
             processes. The clients reach the store through a recording proxy (store_wire_trace.py), so the
             checks also prove which requests torch put on the wire: the legacy dialect for 1.13; for 2.6
             VALIDATE + PING on every connection, CANCEL_WAIT after a wait timeout, MULTI_GET, MULTI_SET, APPEND.
  keyspaces  ddprun's worker keyspaces (docs/rendezvous.md) seen from torch clients: after a write of
             "/ddprun/worker_keyspace", clients connected before and after see separate keys, and a keyspace
             is erased once no connection holds it. Not with --reference (torch's server has no keyspaces),
             nor with --ipv6.
With --ipv6 the main checks (without gloo) run against [::1] (exit 77 = skipped when the machine has no IPv6
loopback). The store is always stopped with SIGTERM, and must still be alive before that and exit 0 after it.
--reference runs the main checks against torch's own TCPStore server instead (INTERP runs it, mimicking
ddprun-store's output and SIGTERM handling): it proves that what the checks expect is torch's behaviour.
--expect-torch X.Y fails the run unless INTERP's torch is version X.Y (a guard against a misconfigured INTERP).
Torch's Python API has no queue operations (QUEUE_PUSH/POP/LEN) up to 2.6: they are covered from C++.
Standard library only.

Exit status 0 only when every check passed.
"""

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

SKIP = 77
CHECKS_TIMEOUT = 420  # seconds for one phase's checks process (torch 2.6 in its root imports slowly)
CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_store_checks.py")
FAILURES = []


def check(name, ok, detail=""):
    print(("ok    " if ok else "FAIL  ") + name + ("" if ok else ": " + detail), flush=True)
    if not ok:
        FAILURES.append(name)


def check_eq(name, got, want):
    check(name, got == want, f"got {got!r}, want {want!r}")


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
        deadline = time.monotonic() + 60
        self.port = None
        while self.port is None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("the store did not report its port within 60 s: " + "".join(self.lines))
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the store exited ({self.proc.wait()}) before listening: " + "".join(self.lines))
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


# ---- main -----------------------------------------------------------------------------------------------


def have_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def run_phase(phase, store_command, python, host, extra):
    t0 = time.monotonic()
    store = StoreProcess(store_command)
    try:
        print(f"==== phase {phase}: store on port {store.port}, checks run by {python}", flush=True)
        proc = subprocess.Popen([python, CHECKS, phase, host, str(store.port), *extra], start_new_session=True)
        try:
            rc = proc.wait(timeout=CHECKS_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = f"killed after {CHECKS_TIMEOUT} s"
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the checks left behind (nothing, normally)
        except ProcessLookupError:
            pass
        proc.wait()
        check(f"phase {phase}: every check passed", rc == 0, f"checks process: exit status {rc}")
    finally:
        alive, code = store.stop()
        check(f"phase {phase}: the store still alive at the end (did not crash)", alive, f"exit code {code}")
        check_eq(f"phase {phase}: the store exits 0 on SIGTERM", code, 0)
        if FAILURES:
            print("---- store output ----\n" + "".join(store.lines))
    print(f"--    phase {phase}: {time.monotonic() - t0:.1f} s", flush=True)


def value_of(args, flag):
    if flag not in args:
        return None
    i = args.index(flag)
    if i + 1 >= len(args):
        raise SystemExit(f"{flag} needs a value")
    del args[i]
    return args.pop(i)


def main():
    args = sys.argv[1:]
    python = value_of(args, "--python") or sys.executable
    expect = value_of(args, "--expect-torch")
    reference = "--reference" in args
    ipv6 = "--ipv6" in args
    paths = [a for a in args if not a.startswith("--")]
    unknown = [a for a in args if a.startswith("--") and a not in ("--reference", "--ipv6")]
    if unknown or (reference and (paths or ipv6)) or (not reference and len(paths) != 1):
        print(__doc__)
        return 2
    if ipv6 and not have_ipv6_loopback():
        print("SKIP: no IPv6 loopback (::1) on this machine")
        return SKIP
    host = "::1" if ipv6 else "127.0.0.1"
    store_command = [python, "-c", REFERENCE_SERVER] if reference else [paths[0], "--port", "0"]
    extra = (["--reference"] if reference else []) + (["--expect-torch", expect] if expect else [])
    t_start = time.monotonic()
    phases = ["main"] + ([] if reference or ipv6 else ["keyspaces"])
    for phase in phases:
        try:
            run_phase(phase, store_command, python, host, extra)
        except Exception:
            check(f"phase {phase}: no unexpected exception", False, traceback.format_exc())
    print(f"{len(FAILURES)} failure(s) in {time.monotonic() - t_start:.1f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
