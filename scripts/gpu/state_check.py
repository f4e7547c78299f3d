#!/usr/bin/env python3
"""ddprun.state with tensors on a device (scripts/gpu-checks.sh, check 5): every rank saves a model and a large
tensor each step (async_ every other step), rank 1 crashes at --crash-step in the first attempt; after the
restart every rank loads the agreed step and checks that the tensors came back on the device with the values
that step saved. Then, on rank 0, the costs beside torch.save to a local file with fsync and torch.load.
Prints one 'state-check:' line per fact; exits 0 when the restored state is right.

    ddprun --standalone --nproc_per_node 2 --max_restarts 1 --state_memory 4G state_check.py --device cuda
"""
import argparse
import os
import sys
import time

import torch
import ddprun.state

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--mib", type=int, default=256, help="size of the large tensor, MiB")
p.add_argument("--steps", type=int, default=12)
p.add_argument("--crash-step", type=int, default=7)
args = p.parse_args()
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dev = torch.device(args.device, int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()) \
    if args.device == "cuda" else torch.device("cpu")
say = lambda *a: print(f"state-check: rank {rank} attempt {attempt}:", *a, flush=True)


def state_of(step):
    torch.manual_seed(step * 10 + rank)
    model = torch.nn.Linear(256, 256).to(dev)
    big = torch.full((args.mib << 20 >> 2,), float(step * 10 + rank), device=dev)
    return {"model": model.state_dict(), "big": big, "step": step}


t0 = time.perf_counter()
got = ddprun.state.load()
took = time.perf_counter() - t0
start = 0
if got is not None:
    step, state = got
    want = state_of(step)
    same = all(torch.equal(state["model"][k].to(dev), want["model"][k]) for k in want["model"])
    same = same and torch.equal(state["big"].to(dev), want["big"]) and state["step"] == step
    say(f"loaded step {step} in {took * 1000:.0f} ms (check {(time.perf_counter() - t0 - took) * 1000:.0f} ms): "
        f"device {state['big'].device}, values {'right' if same else 'WRONG'}")
    if not same:
        sys.exit(1)
    start = step + 1
elif attempt > 0:
    say(f"load() is None after a restart: {ddprun.state.why_none()}")
    sys.exit(1)

for step in range(start, args.steps):
    state = state_of(step)
    t0 = time.perf_counter()
    ddprun.state.save(step, state, async_=step % 2 == 1)
    paused = time.perf_counter() - t0
    if rank == 0 and step in (start, start + 1):
        say(f"save of step {step} ({'async_' if step % 2 else 'sync'}, {args.mib} MiB + model): "
            f"the loop paused {paused * 1000:.1f} ms")
    if rank == 1 and attempt == 0 and step == args.crash_step:
        ddprun.state.wait()
        say(f"crashing after step {step}")
        os._exit(3)
ddprun.state.wait()

if rank == 0 and attempt > 0:
    state = state_of(0)
    path = f"/tmp/state-check-{os.getpid()}.pt"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    saved = time.perf_counter() - t0
    os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    t0 = time.perf_counter()
    back = torch.load(path, map_location=dev)
    torch.equal(back["big"], state["big"])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    loaded = time.perf_counter() - t0
    os.unlink(path)
    say(f"torch.save + fsync {saved * 1000:.0f} ms, torch.load to {dev.type} {loaded * 1000:.0f} ms "
        f"({args.mib} MiB + model)")
say("done")
