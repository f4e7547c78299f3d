"""The worker of scripts/bench-state.sh: one rank under `ddprun --state_memory`, with SIZE MiB of float32 state
(16 tensors). Attempt 0 times, REPS times each: ddprun.state.save (synchronous), the loop's pause for an
ddprun.state.save(async_=True) (and the background write to its commit, via wait()), torch.save to a local disk
file with fsync; writes its figures to OUT.0.json and dies (os._exit(1)), as a crashed worker. The agent
restarts it: attempt 1 times ddprun.state.load() plus a read of every page of the tensors it returns, checks
the bytes are those saved, then torch.load of the disk file after its pages are dropped from the page cache
(posix_fadvise DONTNEED after fsync), and writes OUT.1.json.

    state_bench.py SIZE_MIB REPS DISK_FILE OUT
"""
import json
import os
import sys
import time

import torch

import ddprun.state

size_mib, reps, disk_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
N_TENSORS = 16


def make_state():
    g = torch.Generator().manual_seed(7)
    per = size_mib * (1 << 20) // 4 // N_TENSORS
    return {"step": 0, "tensors": [torch.randn(per, generator=g) for _ in range(N_TENSORS)]}


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def touch_pages(tensors):
    total = 0.0
    for t in tensors:
        total += float(t.view(torch.uint8)[::4096].sum())  # one byte per page: every page mapped in
    return total


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def disk_save(state):
    with open(disk_file, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


if attempt == 0:
    state = make_state()
    figures = {"sync_save_s": [], "async_block_s": [], "async_commit_s": [], "disk_save_s": []}
    step = 0
    for _ in range(reps):
        step += 1
        figures["sync_save_s"].append(timed(lambda: ddprun.state.save(step, state)))
        step += 1
        t0 = time.perf_counter()
        ddprun.state.save(step, state, async_=True)
        figures["async_block_s"].append(time.perf_counter() - t0)
        ddprun.state.wait()
        figures["async_commit_s"].append(time.perf_counter() - t0)
        figures["disk_save_s"].append(timed(lambda: disk_save(state)))
    figures["step"] = step
    with open(out + ".0.json", "w") as f:
        json.dump(figures, f)
    sys.stdout.flush()
    os._exit(1)  # a crash: the agent starts this rank again

expected = make_state()
t0 = time.perf_counter()
got = ddprun.state.load()
load_s = time.perf_counter() - t0
if got is None:
    raise SystemExit(f"state_bench: load() returned None: {ddprun.state.why_none()}")
step, state = got
touch_pages(state["tensors"])
restore_s = time.perf_counter() - t0
same = all(torch.equal(a, b) for a, b in zip(state["tensors"], expected["tensors"]))
drop_cache(disk_file)
t0 = time.perf_counter()
from_disk = torch.load(disk_file)
disk_load_s = time.perf_counter() - t0
with open(out + ".1.json", "w") as f:
    json.dump({"load_s": load_s, "restore_s": restore_s, "step": step, "identical": same,
               "disk_load_s": disk_load_s, "disk_identical": all(
                   torch.equal(a, b) for a, b in zip(from_disk["tensors"], expected["tensors"]))}, f)
