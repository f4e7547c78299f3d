#!/usr/bin/env python3
"""A real DDP training job for ddprun (or torchrun): a small MLP on synthetic regression data, gloo on CPUs
(NCCL on GPUs with --device cuda).

Run under a launcher, which sets RANK, WORLD_SIZE, MASTER_ADDR, ... :
    ddprun --standalone --nproc_per_node 4 scripts/examples/ddp_train.py --steps 200

Every rank draws its own shard of a fixed synthetic dataset, DDP averages the gradients, and at the end the
ranks compare a checksum of their parameters (they must be identical). Options for tests: --out DIR writes
<DIR>/rank<R>.json with the checksum; --fail-rank/--fail-step/--fail-attempt make one rank crash once;
--checkpoint FILE saves every --save-every steps from rank 0 and resumes from it after a restart; --stop-file FILE ends
the training early, at the same step on every rank, once FILE exists (a test that has seen what it waited for
need not wait for --steps); --stamp FILE
appends timestamped lines (script start, first completed step of each attempt, crash) for
scripts/bench-recovery.sh; --hang-rank/--hang-step/--hang-attempt make one rank stop in
stuck_in_data_loading() (a sleep outside any collective) while the others wait in theirs; --load-seconds makes
every rank spend that long loading each batch, --slow-rank/--slow-seconds one rank that much longer (a straggler).
Under ddprun every rank writes its global step, the time from the top of the step to its first gradient bucket's
all-reduce (a DDP communication hook notes it) and the step time to $DDPRUN_PROGRESS_FILE: ddprun's hang
detection, `ddprun status` and its straggler report read them.
"""
import argparse
import datetime
import json
import os
import sys
import time


def stamp(path, event, attempt, rank):
    """Appends one '<event> <attempt> <rank> <unix ns>' line to path (no-op without a path)."""
    if not path:
        return
    line = f"{event} {attempt} {rank} {time.time_ns()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class ProgressFile:
    """The step, as ddprun reads it: one line '<step> <seconds before the first collective> <step seconds>'
    overwritten in place in $DDPRUN_PROGRESS_FILE (docs/observability.md#the-heartbeat-file). Does nothing when
    the variable is not set."""

    def __init__(self):
        path = os.environ.get("DDPRUN_PROGRESS_FILE")
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644) if path else None

    def step(self, step, before_collective, seconds):
        if self.fd is not None:
            os.pwrite(self.fd, f"{step:20d} {before_collective:18.6f} {seconds:18.6f}\n".encode(), 0)


class FirstCollective:
    """A DDP communication hook (DDP's own all-reduce, averaged) that notes when the step's first gradient
    bucket starts its all-reduce: the end of this rank's own work before it waits for the others."""

    def __init__(self):
        self.at = None

    def hook(self, state, bucket):
        if self.at is None:
            self.at = time.monotonic()
        return allreduce_hook(state, bucket)


def stuck_in_data_loading():
    """A data loader that never returns: the rank sleeps while its peers wait in the next all-reduce."""
    while True:
        time.sleep(3600)


def early_stamp_path(argv):
    """The --stamp FILE of argv, read before argparse runs (None when absent)."""
    for i, a in enumerate(argv):
        if a == "--stamp" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--stamp="):
            return a[len("--stamp="):]
    return None


# With --stamp, the script's start is stamped before torch is imported, so that a benchmark can split a
# restart into the launcher's share (crash -> replacement running) and the worker's (import, init, first step).
stamp(early_stamp_path(sys.argv[1:]), "start", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
      os.environ.get("RANK", "-"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: gloo (the default); cuda: NCCL, local rank N on GPU N modulo the GPUs visible")
    p.add_argument("--batch", type=int, default=64, help="per-rank batch size")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--out", help="directory for per-rank result files")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--fail-attempt", type=int, default=0, help="restart attempt in which --fail-rank crashes")
    p.add_argument("--fail-until-attempt", type=int, default=-1,
                   help="--fail-rank crashes (os._exit(3), no clean-up) in every attempt below this one")
    p.add_argument("--fail-file", help="--fail-rank crashes (os._exit(3)) after the first step at which this file "
                   "exists, and removes it (a test's trigger)")
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--hang-attempt", type=int, default=0, help="restart attempt in which --hang-rank hangs")
    p.add_argument("--checkpoint", help="checkpoint file (rank 0 writes, every rank resumes)")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--load-seconds", type=float, default=0,
                   help="seconds every rank spends loading each batch (a sleep before the forward pass)")
    p.add_argument("--slow-rank", type=int, default=-1, help="a rank that loads each batch --slow-seconds longer")
    p.add_argument("--slow-seconds", type=float, default=0)
    p.add_argument("--step-sleep", type=float, default=0,
                   help="seconds to sleep after each step: stands for a GPU step, during which the CPU is idle")
    p.add_argument("--pg-timeout", type=float, default=60,
                   help="init_process_group's timeout in seconds: how long a collective waits for a missing rank "
                   "(torch's default for gloo is 1800)")
    p.add_argument("--stop-file", help="end the training early once this file exists: every --stop-every steps "
                   "the ranks all-reduce whether they see it and stop together after that step")
    p.add_argument("--stop-every", type=int, default=10)
    p.add_argument("--stamp", help="append '<event> <attempt> <rank> <unix ns>' lines to this file: 'start' "
                   "when the script starts (before torch is imported), 'first-step' when the rank completes "
                   "its first step of the attempt (optimizer step done), 'crash' just before a "
                   "--fail-until-attempt crash, 'hang' when --hang-rank stops (CLOCK_REALTIME; one O_APPEND write each)")
    return p.parse_args()


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.pg_timeout))
    assert dist.get_rank() == rank and dist.get_world_size() == world

    torch.manual_seed(1234)  # same initial parameters everywhere (DDP also broadcasts from rank 0)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(device)
    ddp = DDP(model)
    first_collective = FirstCollective()
    ddp.register_comm_hook(None, first_collective.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        if rank == 0:
            print(f"resumed from {args.checkpoint} at step {start}", flush=True)

    gen = torch.Generator().manual_seed(99)
    true_w = torch.randn(32, 1, generator=gen)
    data_gen = torch.Generator().manual_seed(1000 + rank)
    t0 = time.time()
    loss = torch.tensor(0.0)
    true_w = true_w.to(device)
    progress = ProgressFile()
    last = time.monotonic()
    for step in range(start, args.steps):
        if rank == args.hang_rank and step == args.hang_step and attempt == args.hang_attempt:
            print(f"rank {rank}: hanging at step {step} (attempt {attempt})", file=sys.stderr, flush=True)
            stamp(args.stamp, "hang", attempt, rank)
            stuck_in_data_loading()
        top = time.monotonic()
        first_collective.at = None
        load = args.load_seconds + (args.slow_seconds if rank == args.slow_rank else 0)
        if load:
            time.sleep(load)
        x = torch.randn(args.batch, 32, generator=data_gen)
        y = x.to(device) @ true_w + 0.01 * torch.randn(args.batch, 1, generator=data_gen).to(device)
        x = x.to(device)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        now = time.monotonic()
        before = first_collective.at - top if first_collective.at is not None else -1
        progress.step(step + 1, before, now - last)  # the global step: resumed attempts continue the count
        last = now
        if step == start:
            stamp(args.stamp, "first-step", attempt, rank)
        if rank == args.fail_rank and step == args.fail_step and attempt < args.fail_until_attempt:
            print(f"rank {rank}: crashing at step {step} (attempt {attempt})", file=sys.stderr, flush=True)
            stamp(args.stamp, "crash", attempt, rank)
            os._exit(3)
        if rank == args.fail_rank and args.fail_file and os.path.exists(args.fail_file):
            print(f"rank {rank}: crashing at step {step} ({args.fail_file} exists)", file=sys.stderr, flush=True)
            os.unlink(args.fail_file)
            os._exit(3)
        if rank == args.fail_rank and step == args.fail_step and attempt == args.fail_attempt:
            print(f"rank {rank}: failing on purpose at step {step} (attempt {attempt})", file=sys.stderr, flush=True)
            leave(13)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == 0 and args.checkpoint and (step + 1) % args.save_every == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, args.checkpoint)
        if rank == 0 and (step + 1) % args.log_every == 0:
            rate = (step + 1 - start) * args.batch * world / (time.time() - t0)
            print(f"step {step + 1}/{args.steps} loss {loss.item():.5f} ({rate:.0f} samples/s)", flush=True)
        if args.stop_file and (step + 1) % args.stop_every == 0 and stop_requested(args.stop_file, device):
            if rank == 0:
                print(f"stopping after step {step + 1}: {args.stop_file} exists", flush=True)
            break

    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    sums = [None] * world
    dist.all_gather_object(sums, checksum)
    identical = all(s == sums[0] for s in sums)
    if rank == 0:
        print(f"done: {world} ranks, final loss {loss.item():.5f}, parameters identical: {identical}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": world, "attempt": attempt, "checksum": checksum,
                       "identical": identical, "loss": loss.item(), "local_rank": int(os.environ["LOCAL_RANK"]),
                       "group_rank": int(os.environ["GROUP_RANK"])}, f)
    # No destroy_process_group(): gloo's can hang at exit (pytorch#75097; seen here with torch 2.6 in 2 of 4
    # runs). The last collective is done, and leave() ends the process at once.
    leave(0 if identical else 3)


def stop_requested(path, device):
    """True on every rank when any rank sees `path` (one all-reduce: the ranks stop at the same step)."""
    flag = torch.tensor([1 if os.path.exists(path) else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def leave(code):
    """Exits without freeing the DDP model. In torch 1.13, ~ProcessGroupGloo (from ~Reducer) joins a gloo
    thread that may still be dropping a finished work's tensors, which needs the GIL the joining thread holds:
    a deadlock seen in 2 of 5 six-rank runs. Nothing is left to clean up (files closed, output flushed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
