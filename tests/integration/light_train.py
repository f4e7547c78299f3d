#!/usr/bin/env python3
"""The light test worker: scripts/examples/ddp_train.py's contract with the launcher and its tests, without torch.

Takes ddp_train.py's options - parsed by ddp_train.py's own parser, whose source it compiles with its heartbeat
file, stamps and exit (from_ddp_train; those about the model, --batch, --hidden and --lr, have no effect here;
--pg-timeout bounds the collectives as gloo's timeout does) - and its own --step-seconds, and writes what
ddp_train.py writes, so that a test written for ddp_train.py runs unchanged with either worker:
  - stdout of rank 0: "resumed from FILE at step N", "step S/STEPS loss L (R samples/s)" every --log-every
    steps, "stopping after step S: FILE exists", "done: W ranks, final loss L, parameters identical: B";
    stderr: "rank R: hanging|crashing|failing on purpose at step S (...)";
  - --out DIR: rank<R>.json with rank, world_size, attempt, checksum (every rank must agree), identical, loss,
    local_rank, group_rank;
  - --checkpoint FILE: rank 0 saves every --save-every steps, every rank resumes from it;
  - $DDPRUN_PROGRESS_FILE: "<step> <seconds before the first collective> <step seconds>" every step;
  - --stamp FILE: start, first-step, crash and hang lines; --fail-*, --hang-*, --load-seconds, --slow-rank,
    --stop-file as in ddp_train.py. A hung rank sleeps in stuck_in_data_loading().
It starts in tens of milliseconds (standard library only). Under ddprun --prestart the standbys import torch
unless the interpreter cannot find it: the tests give light workers PYTHONPATH=tests/integration/without_torch.

The ranks train in lock step, as DDP's ranks do: one "parameter" (an integer) that each step changes by the sum
of every rank's "gradient" (a function of the parameter, the rank and the step), so that ranks that did not see
the same steps, sums or checkpoint end with different checksums. The sums travel like gloo's all-reduce: the
job's store only bootstraps the group - with the agent's store (TORCHELASTIC_USE_AGENT_STORE=True) rank 0
listens on a free port and publishes "<address> <port>" under /light_train/rank0 in the store at
MASTER_ADDR:MASTER_PORT (the attempt's keyspace: a stale address from an earlier attempt would be a launcher
bug); without it (torch's env:// rule) rank 0 listens on MASTER_PORT - and every other rank holds one TCP
connection to rank 0, which sums and answers each step. So a rank that dies is seen by the others at once (the
connection closes) and one that hangs after --pg-timeout seconds; either way a survivor says so naming the
step and the rank it lost and exits 1 --teardown-seconds later, as a gloo rank raises on a dead or silent peer
and its interpreter shuts down (57 ms after its peer's crash with torch 1.13 here, on a loaded machine more:
ddprun counts a failure against the node whose worker failed first, so an echo must not beat the crash it
echoes). The store connection stays open, idle, for the worker's life (torch's workers keep theirs).
"""
import argparse
import ast
import json
import os
import socket
import sys
import time

from tcpstore_client import StoreLost, StoreTimeout, TCPStoreClient

RANK0_KEY = "/light_train/rank0"
MODULUS = (1 << 61) - 1
DDP_TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "examples",
                         "ddp_train.py")


def from_ddp_train(*names):
    """ddp_train.py's own top-level definitions `names` (torch-free ones: its option parser, its heartbeat file,
    its stamps), compiled from its source without running it (running it imports torch): one piece of code for
    what both workers must do alike."""
    with open(DDP_TRAIN) as f:
        tree = ast.parse(f.read(), DDP_TRAIN)
    namespace = {"__doc__": ast.get_docstring(tree), "argparse": argparse, "os": os, "sys": sys, "time": time}
    tree.body = [node for node in tree.body if getattr(node, "name", None) in names]
    found = {node.name for node in tree.body}
    if found != set(names):
        raise ImportError(f"{DDP_TRAIN} no longer defines {sorted(set(names) - found)}")
    exec(compile(tree, DDP_TRAIN, "exec"), namespace)
    return [namespace[name] for name in names]


stamp, ProgressFile, ddp_train_args, leave = from_ddp_train("stamp", "ProgressFile", "parse_args", "leave")


class GroupFailed(Exception):
    """A peer is gone or silent: what a gloo collective raises."""


class Lines:
    """Newline-terminated text messages on one socket, each read with a deadline."""

    def __init__(self, sock, peer):
        self.sock, self.peer, self.buffer = sock, peer, b""

    def send(self, text):
        try:
            self.sock.sendall(text.encode() + b"\n")
        except OSError as e:
            raise GroupFailed(f"sending to {self.peer} failed: {e}") from None

    def read(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GroupFailed(f"{self.peer} sent nothing for {timeout:g} s")
            try:
                self.sock.settimeout(left)
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as e:
                raise GroupFailed(f"the connection to {self.peer} failed: {e}") from None
            if not chunk:
                raise GroupFailed(f"{self.peer} closed its connection (it is gone)")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()


class StarGroup:
    """The ranks of one attempt: rank 0 holds a connection to every other rank (see the module comment)."""

    def __init__(self, rank, world, attempt, timeout):
        self.rank, self.world, self.attempt, self.timeout = rank, world, attempt, timeout
        self.peers = {}  # rank 0: rank -> Lines
        self.root = None  # other ranks: Lines to rank 0
        self.store = None
        if world == 1:
            return
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        if agent_store:
            self.store = TCPStoreClient(host, port, timeout=timeout)
        if rank == 0:
            self._serve(port if not agent_store else None)
        else:
            self._join(host, port)

    def _serve(self, port):
        if port is None:  # the agent's store has MASTER_PORT: listen beside it, publish where
            address = self.store.local_address()
            listener = socket.create_server((address, 0), family=socket.AF_INET6 if ":" in address
                                            else socket.AF_INET)
            self.store.set(RANK0_KEY, f"{address} {listener.getsockname()[1]}")
        else:
            listener = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        deadline = time.monotonic() + self.timeout
        while len(self.peers) < self.world - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GroupFailed(f"only ranks {sorted(self.peers)} of {self.world} connected within "
                                  f"{self.timeout:g} s")
            listener.settimeout(left)
            try:
                sock, where = listener.accept()
            except socket.timeout:
                continue
            lines = Lines(sock, f"a worker at {where[0]}")
            hello = lines.read(self.timeout).split()
            if len(hello) != 4 or hello[0] != "hello" or hello[2:] != [str(self.attempt), str(self.world)]:
                raise GroupFailed(f"unexpected greeting {hello} (expected attempt {self.attempt}, world "
                                  f"{self.world})")
            lines.peer = f"rank {hello[1]}"
            self.peers[int(hello[1])] = lines
        listener.close()

    def _join(self, host, port):
        if self.store is not None:
            self.store.wait([RANK0_KEY], self.timeout)
            host, port = self.store.get(RANK0_KEY).decode().split()
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sock = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise GroupFailed(f"rank 0 at {host}:{port} did not answer within {self.timeout:g} s: "
                                      f"{e}") from None
                time.sleep(0.05)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.root = Lines(sock, "rank 0")
        self.root.send(f"hello {self.rank} {self.attempt} {self.world}")

    def receive(self):
        """One message from each rank this one waits for in a collective: rank 0 from every other rank (in rank
        order), the others from rank 0. Every rank waits here, on the same line (ddprun's stack summary then
        groups the waiting ranks, as it groups gloo ranks waiting in one all-reduce)."""
        sources = [self.peers[r] for r in range(1, self.world)] if self.rank == 0 else [self.root]
        return [source.read(self.timeout).split() for source in sources]

    def allreduce(self, step, values):
        """The element-wise sums of every rank's `values` (integers) for `step`."""
        if self.world == 1:
            return list(values)
        if self.rank != 0:
            self.root.send(" ".join(map(str, [step, *values])))
        received = self.receive()
        if self.rank != 0:
            return [int(v) for v in received[0]]
        sums = list(values)
        for peer, got in enumerate(received, start=1):
            if int(got[0]) != step:
                raise GroupFailed(f"rank {peer} is at step {got[0]}")
            sums = [a + int(b) for a, b in zip(sums, got[1:])]
        for peer in self.peers.values():
            peer.send(" ".join(map(str, sums)))
        return sums

    def allgather(self, value):
        """Every rank's `value` (text without spaces), in rank order."""
        if self.world == 1:
            return [value]
        if self.rank != 0:
            self.root.send(value)
        received = self.receive()
        if self.rank != 0:
            return received[0]
        values = [value] + [got[0] for got in received]
        for peer in self.peers.values():
            peer.send(" ".join(values))
        return values


def stuck_in_data_loading():
    """A data loader that never returns: the rank sleeps while its peers wait in the next collective."""
    while True:
        time.sleep(3600)


def gradient(param, rank, step):
    return (param * 31 + 7 * (rank + 1) + step) % 1009


def parse_args():
    """ddp_train.py's options (its own parser), and the light worker's own, which it leaves out of sys.argv."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--step-seconds", type=float, default=0.02,
                   help="a step's compute after its collective (a sleep: backward's rest and the optimizer); it "
                   "paces the steps near the tests' real jobs (ddp_train.py --hidden 32 --batch 16 on 2 cores "
                   "at load 11: 4 ranks 67 steps/s, 2 ranks 318): a job's --steps bound lasts about as long")
    p.add_argument("--teardown-seconds", type=float, default=0.2,
                   help="how long a rank whose collective failed takes to exit (a torch rank's traceback and "
                   "interpreter shutdown)")
    own, sys.argv[1:] = p.parse_known_args(sys.argv[1:])
    args = ddp_train_args()
    args.step_seconds, args.teardown_seconds = own.step_seconds, own.teardown_seconds
    return args


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    stamp(args.stamp, "start", attempt, rank)
    step = None
    try:
        group = StarGroup(rank, world, attempt, args.pg_timeout)
        param, start = 1, 0
        if args.checkpoint and os.path.exists(args.checkpoint):
            with open(args.checkpoint) as f:
                state = json.load(f)
            param, start = state["param"], state["step"] + 1
            if rank == 0:
                print(f"resumed from {args.checkpoint} at step {start}", flush=True)
        progress = ProgressFile()
        t0 = time.time()
        last = time.monotonic()
        loss = 0.0
        for step in range(start, args.steps):
            if rank == args.hang_rank and step == args.hang_step and attempt == args.hang_attempt:
                print(f"rank {rank}: hanging at step {step} (attempt {attempt})", file=sys.stderr, flush=True)
                stamp(args.stamp, "hang", attempt, rank)
                stuck_in_data_loading()
            top = time.monotonic()
            load = args.load_seconds + (args.slow_seconds if rank == args.slow_rank else 0)
            if load:
                time.sleep(load)
            check_stop = args.stop_file and (step + 1) % args.stop_every == 0
            sees_stop = 1 if check_stop and os.path.exists(args.stop_file) else 0
            before = time.monotonic() - top
            total, stops = group.allreduce(step, [gradient(param, rank, step), sees_stop])
            param = (param + total) % MODULUS
            loss = (param % 100000) / 100000
            time.sleep(args.step_seconds)
            now = time.monotonic()
            progress.step(step + 1, before, now - last)
            last = now
            if step == start:
                stamp(args.stamp, "first-step", attempt, rank)
            if rank == args.fail_rank and step == args.fail_step and attempt < args.fail_until_attempt:
                print(f"rank {rank}: crashing at step {step} (attempt {attempt})", file=sys.stderr, flush=True)
                stamp(args.stamp, "crash", attempt, rank)
                os._exit(3)
            if rank == args.fail_rank and args.fail_file and os.path.exists(args.fail_file):
                print(f"rank {rank}: crashing at step {step} ({args.fail_file} exists)", file=sys.stderr,
                      flush=True)
                os.unlink(args.fail_file)
                os._exit(3)
            if rank == args.fail_rank and step == args.fail_step and attempt == args.fail_attempt:
                print(f"rank {rank}: failing on purpose at step {step} (attempt {attempt})", file=sys.stderr,
                      flush=True)
                leave(13)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if rank == 0 and args.checkpoint and (step + 1) % args.save_every == 0:
                tmp = args.checkpoint + ".tmp"
                with open(tmp, "w") as f:
                    json.dump({"step": step, "param": param}, f)
                os.replace(tmp, args.checkpoint)
            if rank == 0 and (step + 1) % args.log_every == 0:
                rate = (step + 1 - start) * world / (time.time() - t0)
                print(f"step {step + 1}/{args.steps} loss {loss:.5f} ({rate:.0f} samples/s)", flush=True)
            if check_stop and stops:
                if rank == 0:
                    print(f"stopping after step {step + 1}: {args.stop_file} exists", flush=True)
                break
        step = "end"
        sums = group.allgather(str(param))
    except (GroupFailed, StoreLost, StoreTimeout) as e:
        where = f"at step {step}" if isinstance(step, int) else ("after the last step" if step else "at start")
        print(f"rank {rank}: the group failed {where}: {e}", file=sys.stderr, flush=True)
        time.sleep(args.teardown_seconds)
        leave(1)
    identical = all(s == sums[0] for s in sums)
    if rank == 0:
        print(f"done: {world} ranks, final loss {loss:.5f}, parameters identical: {identical}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": world, "attempt": attempt, "checksum": param,
                       "identical": identical, "loss": loss, "local_rank": int(os.environ["LOCAL_RANK"]),
                       "group_rank": int(os.environ["GROUP_RANK"])}, f)
    leave(0 if identical else 3)


if __name__ == "__main__":
    main()
