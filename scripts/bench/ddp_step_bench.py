#!/usr/bin/env python3
"""Training-step benchmark, Python side: the same MLP, synthetic data, sampler and optimizer as
worker_sdk/examples/train_mlp.cc (ddprun-example-train), trained with torch.nn.parallel.DistributedDataParallel
over gloo. Run under a launcher (ddprun or torchrun), which sets RANK, WORLD_SIZE, MASTER_ADDR, ...:

    ddprun --standalone --nproc_per_node 2 --python /usr/bin/python3 scripts/bench/ddp_step_bench.py --steps 60

A step is timed as in the C++ example: from zero_grad to the end of optimizer.step(), batch indexing included;
the first --warmup steps are left out. Rank 0 prints the same "summary:" line as the example, so
scripts/bench-train-step.sh parses both alike.
"""
import argparse
import datetime
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dataset-size", type=int, default=1 << 16)
    p.add_argument("--input-dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: device LOCAL_RANK, nccl")
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()

    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.dataset_size, args.input_dim, generator=gen)
    w = torch.randn(args.input_dim, 16, generator=gen) / math.sqrt(args.input_dim)
    v = torch.randn(16, 1, generator=gen)
    y = torch.tanh(x @ w) @ v + 0.01 * torch.randn(args.dataset_size, 1, generator=gen)
    x, y = x.to(device), y.to(device)

    torch.manual_seed(args.seed)
    layers, width = [], args.input_dim
    for _ in range(args.layers - 1):
        layers += [nn.Linear(width, args.hidden), nn.ReLU()]
        width = args.hidden
    layers.append(nn.Linear(width, 1))
    model = DDP(nn.Sequential(*layers).to(device), bucket_cap_mb=args.bucket_cap_mb,
                device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = DistributedSampler(range(args.dataset_size), num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    steps_per_epoch = sampler.num_samples // args.batch_size

    step, times = 0, []
    loss = torch.zeros(())
    while step < args.steps:
        sampler.set_epoch(step // steps_per_epoch)
        idx_all = list(iter(sampler))
        for b in range(step % steps_per_epoch, steps_per_epoch):
            if step >= args.steps:
                break
            t0 = time.perf_counter()
            opt.zero_grad()
            idx = torch.tensor(idx_all[b * args.batch_size:(b + 1) * args.batch_size]).to(device)
            loss = nn.functional.mse_loss(model(x.index_select(0, idx)), y.index_select(0, idx))
            loss.backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # a step ends when the GPU is done, as in the C++ example
            step += 1
            if step > args.warmup:
                times.append((time.perf_counter() - t0) * 1000)

    if rank == 0:
        mean = statistics.fmean(times) if times else 0.0
        median = statistics.median(times) if times else 0.0
        rate = args.batch_size * world * 1000 / mean if mean else 0.0
        print(f"done: {world} ranks, final loss {loss.item():.5f}")
        print(f"summary: ranks={world} steps={len(times)} step_ms_mean={mean:.3f} step_ms_median={median:.3f} "
              f"samples_per_s={rate:.0f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # see scripts/examples/ddp_train.py: avoid torch 1.13's gloo teardown deadlock


if __name__ == "__main__":
    main()
