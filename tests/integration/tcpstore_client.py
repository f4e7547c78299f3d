"""A minimal client of PyTorch's TCPStore protocol, legacy dialect (torch 1.13/2.0; docs/wire-protocol.md), for the
light test worker (light_train.py). Standard library only; no torch.

    store = TCPStoreClient(host, port, timeout=30)   # connects (retrying until `timeout`)
    store.set(key, value); store.get(key); store.add(key, delta); store.wait([keys], timeout)

Keys go on the wire as given (torch's Python client prefixes user keys with "/": do it yourself if you want
the same keys). One connection, one thread: not thread-safe. Every request has a deadline (`timeout` of the
constructor; wait() takes its own): StoreTimeout when it passes, StoreLost when the store closes the
connection or the socket fails. A legacy client cannot cancel a WAIT, so after a wait() that timed out the
connection is closed (a late reply would confuse the next request): create a new client to go on.
"""
import socket
import struct
import time

# Legacy command bytes (torch 1.13 and 2.0).
SET, COMPARE_SET, GET, ADD, CHECK, WAIT = 0, 1, 2, 3, 4, 5


class StoreLost(Exception):
    """The store closed the connection, or the socket failed."""


class StoreTimeout(Exception):
    """A request got no (complete) reply before its deadline."""


def _string(data):
    data = data.encode() if isinstance(data, str) else bytes(data)
    return struct.pack("<Q", len(data)) + data


class TCPStoreClient:
    def __init__(self, host, port, timeout=30.0):
        """Connects to host:port, retrying refused connections until `timeout` s have passed (the store may
        not listen yet); StoreTimeout naming the address when it never answers."""
        self.address = f"{host}:{port}"
        self.timeout = timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise StoreTimeout(f"no store answers at {self.address} within {timeout} s: {e}") from None
                time.sleep(0.05)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self):
        self.sock.close()

    def local_address(self):
        """This end's IP address: the address by which the store's host reaches this process."""
        return self.sock.getsockname()[0]

    def set(self, key, value):
        self._send(bytes([SET]) + _string(key) + _string(value))

    def get(self, key):
        """The value (bytes); empty when the key is missing (wait() for it first)."""
        self._send(bytes([GET]) + _string(key))
        return self._read_string(self._deadline(None))

    def add(self, key, delta):
        """Adds `delta` to the key's integer value (a missing key counts as 0); returns the new value."""
        self._send(bytes([ADD]) + _string(key) + struct.pack("<q", delta))
        return struct.unpack("<q", self._read(8, self._deadline(None)))[0]

    def compare_set(self, key, expected, desired):
        """The store's COMPARE_SET (docs/wire-protocol.md); returns the value stored now."""
        self._send(bytes([COMPARE_SET]) + _string(key) + _string(expected) + _string(desired))
        return self._read_string(self._deadline(None))

    def check(self, keys):
        """True when every key exists."""
        self._send(bytes([CHECK]) + struct.pack("<Q", len(keys)) + b"".join(_string(k) for k in keys))
        return self._read(1, self._deadline(None)) == b"\x00"

    def wait(self, keys, timeout=None):
        """Returns once every key exists; StoreTimeout after `timeout` s (default: the client's), and the
        connection is closed then (see the module comment)."""
        self._send(bytes([WAIT]) + struct.pack("<Q", len(keys)) + b"".join(_string(k) for k in keys))
        try:
            reply = self._read(1, self._deadline(timeout))
        except StoreTimeout:
            self.close()
            raise StoreTimeout(f"keys {list(keys)} did not appear in the store at {self.address} within "
                               f"{self.timeout if timeout is None else timeout} s") from None
        if reply != b"\x00":
            raise StoreLost(f"unexpected reply {reply!r} to WAIT from the store at {self.address}")

    def _deadline(self, timeout):
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    def _send(self, data):
        try:
            self.sock.settimeout(self.timeout)
            self.sock.sendall(data)
        except socket.timeout:
            raise StoreTimeout(f"the store at {self.address} took no request for {self.timeout} s") from None
        except OSError as e:
            raise StoreLost(f"the connection to the store at {self.address} failed: {e}") from None

    def _read(self, n, deadline):
        data = b""
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreTimeout(f"no reply from the store at {self.address}")
            try:
                self.sock.settimeout(left)
                chunk = self.sock.recv(n - len(data))
            except socket.timeout:
                raise StoreTimeout(f"no reply from the store at {self.address}") from None
            except OSError as e:
                raise StoreLost(f"the connection to the store at {self.address} failed: {e}") from None
            if not chunk:
                raise StoreLost(f"the store at {self.address} closed the connection")
            data += chunk
        return data

    def _read_string(self, deadline):
        length = struct.unpack("<Q", self._read(8, deadline))[0]
        return self._read(length, deadline) if length else b""
