#!/usr/bin/env python3
"""A large request that reaches the store in small pieces: the store's CPU time for it.

    scripts/bench/store_pieces_bench.py STORE_BINARY [PIECE_BYTES [PAUSE_S [KEYS]]]

Starts STORE_BINARY (ddprun-store) on a free loopback port, sends one modern-dialect MULTI_SET of KEYS keys
(default 20000, ~3 MB) in PIECE_BYTES pieces (default 64) with TCP_NODELAY and a PAUSE_S sleep (default
50 us) after each piece, so that most pieces arrive in reads of their own, then GETNUMKEYS, whose reply
means the MULTI_SET was handled. Prints the wall time and the store's CPU time (from /proc). Run it on two
builds to compare them; the store is killed at the end.
"""
import os
import socket
import struct
import sys
import time

from bench_harness import start_ddprun_store


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    binary = sys.argv[1]
    piece = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.00005
    keys = int(sys.argv[4]) if len(sys.argv) > 4 else 20000
    store, port = start_ddprun_store(binary, "warn")
    try:
        u64 = lambda v: struct.pack("<Q", v)  # noqa: E731
        body = b"".join(u64(len(k)) + k + u64(130) + b"v" * 130 for k in (f"/k{i}".encode() for i in range(keys)))
        validate = b"\x00" + struct.pack("<I", 0x3C85F7CE)
        request = validate + bytes([11]) + struct.pack("<q", keys) + body  # 11: MULTI_SET (modern)
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cpu0, t0 = cpu_seconds(store.pid), time.time()
        for i in range(0, len(request), piece):
            s.sendall(request[i:i + piece])
            if pause:
                time.sleep(pause)
        s.sendall(bytes([7]))  # GETNUMKEYS (modern)
        reply = s.recv(8)
        stored = struct.unpack("<q", reply)[0]
        print(f"{len(request) / 1e6:.2f} MB in {piece}-byte pieces: {stored} keys stored, "
              f"wall {time.time() - t0:.2f} s, store CPU {cpu_seconds(store.pid) - cpu0:.2f} s")
    finally:
        store.kill()
        store.wait()


if __name__ == "__main__":
    main()
