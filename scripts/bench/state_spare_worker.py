"""The worker of scripts/bench/state_spare_bench.py: one rank per host under `ddprun --state_memory`, SIZE MiB of
float32 state (16 tensors, contents by rank). Every attempt starts with ddprun.state.load() and a read of every
page of the tensors it returns, and writes OUT/rank<R>.<pid>.json (rank, the loaded step or null, the time the
load and the read took, whether the bytes are those saved, the wall-clock time it finished). When it loaded
nothing it saves steps 1 and 2 synchronously (the buddy keeps the two newest) and writes OUT/saved.rank<R>.
Then it waits for OUT/stop and exits 0.

    state_spare_worker.py SIZE_MIB OUT
"""
import json
import os
import sys
import time

import torch

import ddprun.state

size_mib, out = int(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
N_TENSORS = 16


def make_state():
    g = torch.Generator().manual_seed(1000 + rank)
    per = size_mib * (1 << 20) // 4 // N_TENSORS
    return {"tensors": [torch.randn(per, generator=g) for _ in range(N_TENSORS)]}


t0 = time.perf_counter()
got = ddprun.state.load()
load_s = time.perf_counter() - t0
report = {"rank": rank, "step": None, "load_s": load_s, "why_none": ddprun.state.why_none()}
if got is not None:
    step, state = got
    for t in state["tensors"]:
        float(t.view(torch.uint8)[::4096].sum())  # one byte per page: every page mapped in
    report.update(step=step, restore_s=time.perf_counter() - t0, finished=time.time(),
                  identical=all(torch.equal(a, b) for a, b in zip(state["tensors"], make_state()["tensors"])))
with open(os.path.join(out, f"rank{rank}.{os.getpid()}.json"), "w") as f:
    json.dump(report, f)
if got is None:
    state = make_state()
    ddprun.state.save(1, state)
    ddprun.state.save(2, state)
    open(os.path.join(out, f"saved.rank{rank}"), "w").close()
while not os.path.exists(os.path.join(out, "stop")):
    time.sleep(0.1)
