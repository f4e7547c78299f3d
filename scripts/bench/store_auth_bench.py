"""The cost of a store's secret (docs/security.md) to an agent's connection: connect, VALIDATE and PING (what
every ddprun client does) against ddprun-store without a secret, beside the same plus the AUTH handshake
(two round trips, an HMAC-SHA256 each way) against ddprun-store --secret-file, N connections each, alternating.

Run by scripts/bench-store-auth.sh; standard library only (the client's HMAC is Python's hmac, as ddprun's is
OpenSSL's: the same computation, a few microseconds either way). Prints a Markdown table; exit codes: 0 done,
2 bad arguments.
"""

import argparse
import hashlib
import hmac
import os
import socket
import statistics
import struct
import subprocess
import tempfile
import time

VALIDATE, PING, AUTH = 0, 13, 0xDD  # modern dialect bytes; AUTH is ddprun's
MAGIC = 0x3C85F7CE


def proof(secret, role, client_nonce, store_nonce):
    message = b"".join(str(len(p)).encode() + b":" + p
                       for p in (b"ddprun store auth v1", role, client_nonce, store_nonce))
    return hmac.new(secret, message, hashlib.sha256).digest()


def read_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the store closed the connection")
        out += chunk
    return out


def read_bytes(sock):
    return read_exact(sock, struct.unpack("<Q", read_exact(sock, 8))[0])


def connect(port, secret):
    """Seconds for one agent connection: connect, VALIDATE + PING, and with `secret` AUTH's two phases."""
    start = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, 7))
    assert struct.unpack("<I", read_exact(sock, 4))[0] == 7
    if secret:
        nonce = os.urandom(32)
        sock.sendall(struct.pack("<BIQ", AUTH, 1, len(nonce)) + nonce)
        store_nonce, store_proof = read_bytes(sock), read_bytes(sock)
        assert hmac.compare_digest(store_proof, proof(secret, b"store", nonce, store_nonce))
        mine = proof(secret, b"agent", nonce, store_nonce)
        sock.sendall(struct.pack("<BIQ", AUTH, 2, len(mine)) + mine)
        assert read_exact(sock, 1) == b"\x01"
    elapsed = time.perf_counter() - start
    sock.close()
    return elapsed


def start_store(store, secret_file):
    argv = [store, "--host", "127.0.0.1", "--port", "0", "--log-level", "error"]
    if secret_file:
        argv += ["--secret-file", secret_file]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()  # "ddprun-store listening on ADDR:PORT"
    return p, int(line.rsplit(":", 1)[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="ddprun-store")
    ap.add_argument("--connections", type=int, default=500)
    args = ap.parse_args()
    secret = os.urandom(32).hex().encode()
    fd, secret_file = tempfile.mkstemp(prefix="ddprun-bench-secret-")
    os.write(fd, secret)
    os.close(fd)
    open_store, open_port = start_store(args.store, None)
    secret_store, secret_port = start_store(args.store, secret_file)
    os.unlink(secret_file)
    try:
        times = {"open": [], "secret": []}
        for _ in range(args.connections):
            times["open"].append(connect(open_port, None))
            times["secret"].append(connect(secret_port, secret))
    finally:
        open_store.kill()
        secret_store.kill()
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{args.connections} connections each over loopback, alternating; load {' '.join(load)}\n")
    print("| store | connect + VALIDATE + PING (+ AUTH): median | p90 | p99 |")
    print("|---|---:|---:|---:|")
    for name, label in (("open", "no secret"), ("secret", "--secret-file (AUTH: 2 more round trips)")):
        t = sorted(times[name])
        q = lambda f: t[min(len(t) - 1, int(f * len(t)))] * 1e6  # noqa: E731
        print(f"| {label} | {statistics.median(t) * 1e6:.0f} µs | {q(0.9):.0f} µs | {q(0.99):.0f} µs |")
    extra = statistics.median(times["secret"]) - statistics.median(times["open"])
    print(f"\nThe handshake adds {extra * 1e6:.0f} µs (median) to an agent's connection.")


if __name__ == "__main__":
    main()
