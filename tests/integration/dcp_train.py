#!/usr/bin/env python3
"""A gloo DDP job (torch 2.x) that keeps its state with torch.distributed.checkpoint on ddprun.state
(ddprun.state.StorageWriter/StorageReader), for tests/integration/test_state_dcp.py.

Run under `ddprun --state_memory ...`: every rank builds the model (a small MLP) and Adam, takes their state dicts
with torch.distributed.checkpoint.state_dict.get_state_dict, and loads the newest step every rank committed with
dcp.load(..., storage_reader=reader) after reader.agree(); when there is none (a first start) it says why and
starts at step 0, as a script would fall back to its disk checkpoint. It saves with
dcp.save(..., storage_writer=ddprun.state.StorageWriter(step)) after every --every-th step. Each step's batch is
drawn from a generator seeded by (step, rank), so a resumed run sees the batches an uninterrupted one would.
--fail-rank R --fail-step S: rank R dies (os._exit(3)) after step S in attempt 0. --out DIR: rank<R>.json with the
attempt, the step it started at, the SHA-256 of its parameters and of its optimizer state, and how many tensors
its last version holds outside the pickle (all of the state's: each rank keeps its own copy of every item).
"""
import argparse
import datetime
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

import ddprun.state


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--load-before-agree", action="store_true",
                   help="on a start without state, first call dcp.load() without reader.agree() and report what it "
                   "raised")
    p.add_argument("--out", required=True)
    return p.parse_args()


def load_before_agree(state, rank):
    """dcp.load() straight away on a start without state: prints the name of what it raised on this rank."""
    try:
        dcp.load(state, storage_reader=ddprun.state.StorageReader(timeout=60))
    except BaseException as e:  # noqa: B036 - torch.distributed.checkpoint's CheckpointException is one
        print(f"rank {rank}: dcp.load() without agree() raised {type(e).__name__}", flush=True)
    else:
        print(f"rank {rank}: dcp.load() without agree() loaded something", flush=True)


def resume(ddp, opt, rank, args):
    """The step to start at: the one after the step loaded from ddprun.state, or 0 when it has none."""
    model_sd, optim_sd = get_state_dict(ddp, opt)
    state = {"model": model_sd, "optim": optim_sd}
    if args.load_before_agree:
        load_before_agree(state, rank)
    reader = ddprun.state.StorageReader(timeout=60)
    if reader.agree() is None:
        print(f"rank {rank}: nothing to resume from ({reader.why_none}): the disk checkpoint applies", flush=True)
        return 0
    dcp.load(state, storage_reader=reader)
    set_state_dict(ddp, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    print(f"rank {rank}: resumed from ddprun.state at step {reader.step + 1}", flush=True)
    return reader.step + 1


def tensors_in_version(rank, step):
    """How many tensors this rank's ddprun.state version of `step` holds outside its pickle (its manifest's
    'tensor' lines: docs/state.md, The version file)."""
    with open(os.path.join(os.environ["DDPRUN_STATE_DIR"], f"rank{rank}.step{step}.ddps"), "rb") as f:
        data = f.read()
    n = int.from_bytes(data[-16:-8], "little")
    return sum(1 for line in data[-16 - n:-16].decode().split("\n") if line.startswith("tensor "))


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    start = resume(ddp, opt, rank, args)
    saved = None  # (step, tensors in this rank's version) of the last save
    for step in range(start, args.steps):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if rank == args.fail_rank and step == args.fail_step and attempt == 0:
            print(f"rank {rank}: crashing after step {step}", file=sys.stderr, flush=True)
            os._exit(3)
        if (step + 1) % args.every == 0:
            model_sd, optim_sd = get_state_dict(ddp, opt)
            dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=ddprun.state.StorageWriter(step))
            saved = (step, tensors_in_version(rank, step))
    optim_tensors = [v for s in opt.state_dict()["state"].values() for _, v in sorted(s.items())]
    result = {"rank": rank, "attempt": attempt, "start_step": start, "params_sha256": digest(model.parameters()),
              "optim_sha256": digest(optim_tensors), "state_tensors": len(list(model.parameters())) + len(optim_tensors),
              "saved": saved}
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, result)  # the last collective: every rank is done before any leaves
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # no destroy_process_group(): gloo's can hang at exit (scripts/examples/ddp_train.py, leave())


if __name__ == "__main__":
    main()
