"""What a TCPStore client really sends: a recording TCP proxy and a parser of the client-to-server byte stream.

    store_wire_trace.py HOST UPSTREAM_PORT RECORD_DIR    (the proxy process RecordingProxy starts)

The interop checks put RecordingProxy between PyTorch's TCPStore clients and the store (ddprun-store or
torch's own server), then parse each connection's bytes with parse_requests() to prove which wire requests
torch sent: VALIDATE and PING when it connects, CANCEL_WAIT when a wait times out, MULTI_GET for multi_get, ...
(docs/wire-protocol.md has the tables). RawStore is a minimal hand-written client for keys torch's Python API
cannot reach ("init/", which torch does not prefix with "/"). Standard library only: the module runs under
any Python, with or without torch.
"""
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading

MAGIC = 0x3C85F7CE
LEGACY_OPS = ["SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "WATCH_KEY", "DELETE_KEY"]
MODERN_OPS = ["VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY",
              "APPEND", "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN",
              "LIST_KEYS"]
# Request fields after the command byte: u = u32, q = i64, s = string (u64 length + bytes),
# n = u64 count then that many strings, m = i64 count then that many (key, value) string pairs.
FIELDS = {"VALIDATE": "u", "PING": "u", "SET": "ss", "COMPARE_SET": "sss", "GET": "s", "ADD": "sq", "CHECK": "n",
          "WAIT": "n", "GETNUMKEYS": "", "WATCH_KEY": "s", "DELETE_KEY": "s", "APPEND": "ss", "MULTI_GET": "n",
          "MULTI_SET": "m", "CANCEL_WAIT": "", "QUEUE_PUSH": "ss", "QUEUE_POP": "s", "QUEUE_LEN": "s",
          "LIST_KEYS": ""}
MAX_LENGTH = 1 << 31  # no check sends a longer string or count: a bigger one means the parse went wrong


class _Incomplete(Exception):
    pass


def parse_requests(data):
    """(dialect, [op name, ...]) of the bytes a client sent on one connection, in order. dialect is "modern"
    when the connection opened with VALIDATE + the magic, else "legacy" (None for an empty stream). A request
    cut off at the end (still being sent) is left out. ValueError for bytes no TCPStore client sends."""
    if not data:
        return None, []
    modern = data[:5] == b"\x00" + struct.pack("<I", MAGIC)
    names = MODERN_OPS if modern else LEGACY_OPS
    ops = []
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(data):
            raise _Incomplete()
        pos += n
        return data[pos - n:pos]

    def length(fmt):
        n = struct.unpack(fmt, take(8))[0]
        if n < 0 or n > MAX_LENGTH:
            raise ValueError(f"implausible length {n} at offset {pos - 8}")
        return n

    def string():
        take(length("<Q"))

    while pos < len(data):
        start = pos
        try:
            byte = take(1)[0]
            if byte >= len(names):
                raise ValueError(f"unknown {'modern' if modern else 'legacy'} command byte {byte} at offset {start}")
            op = names[byte]
            for field in FIELDS[op]:
                if field == "u":
                    take(4)
                elif field == "q":
                    take(8)
                elif field == "s":
                    string()
                elif field == "n":
                    for _ in range(length("<Q")):
                        string()
                elif field == "m":
                    for _ in range(length("<q")):
                        string()
                        string()
            ops.append(op)
        except _Incomplete:
            break
    return ("modern" if modern else "legacy"), ops


class RecordingProxy:
    """A relay between TCPStore clients and the store at (host, upstream_port) that keeps the bytes each client
    sent. It runs in a child process (this module run as a script): torch 1.13's TCPStore constructor holds the
    GIL while it waits for its first reply, so a relay in the clients' own process would deadlock. Each
    connection's client bytes go to their own file in a temporary directory, written before they are
    forwarded: once a client has its reply, its request is on record. close() stops the relay and removes the
    directory; the relay also ends by itself when the process that started it ends."""

    def __init__(self, host, upstream_port):
        self.host = host
        self._dir = tempfile.mkdtemp(prefix="ddprun-wire-")
        # Its stdin is a pipe from here: the relay exits when this process is gone, however it ended.
        self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), host, str(upstream_port), self._dir],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._proc.stdout.readline()
        if not line.startswith("port "):
            self.close()
            raise RuntimeError(f"the recording proxy did not start: {line!r}")
        self.port = int(line.split()[1])

    def connections(self):
        """[(dialect, [ops])] per connection so far, in accept order (see parse_requests; ValueError
        propagates)."""
        names = sorted(os.listdir(self._dir), key=lambda n: int(n.split(".")[0]))
        out = []
        for name in names:
            with open(os.path.join(self._dir, name), "rb") as f:
                out.append(parse_requests(f.read()))
        return out

    def close(self):
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._proc.stdin.close()
        self._proc.stdout.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _relay(host, upstream_port, record_dir):
    """The proxy process: accepts on (host, free port), prints "port N", relays until killed or until its stdin
    reaches end of file (its parent is gone)."""

    def exit_with_parent():
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(256)
    print("port", listener.getsockname()[1], flush=True)
    lock = threading.Lock()

    def pump(src, dst, record, pair, ends):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if record is not None:
                    record.write(data)  # unbuffered: on disk before the store can reply
                dst.sendall(data)
        except OSError:
            pass
        if record is not None:
            record.close()
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with lock:
            ends[0] -= 1
            last = ends[0] == 0
        if last:
            for s in pair:
                s.close()

    n = 0
    while True:
        down, _ = listener.accept()
        try:
            up = socket.create_connection((host, upstream_port), timeout=30)
            up.settimeout(None)
        except OSError:
            down.close()
            continue
        for s in (down, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # torch's own sockets are NODELAY too
        record = open(os.path.join(record_dir, f"{n}.bin"), "wb", buffering=0)
        n += 1
        ends = [2]
        for src, dst, rec in ((down, up, record), (up, down, None)):
            threading.Thread(target=pump, args=(src, dst, rec, (down, up), ends), daemon=True).start()


class RawStore:
    """One raw connection speaking `dialect` ("legacy" or "modern": VALIDATE, then a PING whose echo is checked,
    as torch >= 2.x clients open). Keys are sent as given, without torch's "/" prefix."""

    def __init__(self, host, port, dialect, timeout=30):
        self.dialect = dialect
        self._ops = LEGACY_OPS if dialect == "legacy" else MODERN_OPS
        self._sock = socket.create_connection((host, port), timeout=timeout)
        if dialect == "modern":
            nonce = struct.unpack("<I", os.urandom(4))[0]
            self._send("VALIDATE", struct.pack("<I", MAGIC))
            self._send("PING", struct.pack("<I", nonce))
            echo = struct.unpack("<I", self._read(4))[0]
            if echo != nonce:
                raise RuntimeError(f"PING echoed {echo:#x}, sent {nonce:#x}")

    def add(self, key, delta):
        k = key.encode()
        self._send("ADD", struct.pack("<Q", len(k)) + k + struct.pack("<q", delta))
        return struct.unpack("<q", self._read(8))[0]

    def close(self):
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, op, payload):
        self._sock.sendall(bytes([self._ops.index(op)]) + payload)

    def _read(self, n):
        out = b""
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise RuntimeError("the store closed the connection")
            out += chunk
        return out


if __name__ == "__main__":
    _relay(sys.argv[1], int(sys.argv[2]), sys.argv[3])
