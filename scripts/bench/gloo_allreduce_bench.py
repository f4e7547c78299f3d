"""All-reduce bandwidth of torch.distributed's gloo backend on CPU tensors: the baseline of
ddprun-allreduce-bench, with the same sizes, iteration policy and JSON lines (impl "gloo").

Run under ddprun with a Python that has torch (torch 1.13 here):
    ddprun --standalone --nproc_per_node 4 --no_python /usr/bin/python3 scripts/bench/gloo_allreduce_bench.py
"""
import argparse
import json
import resource
import sys
import time

import torch
import torch.distributed as dist


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process, gloo's included
    return ru.ru_utime + ru.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-iters", type=int, default=2000)
    args = p.parse_args()

    dist.init_process_group("gloo")
    n = dist.get_world_size()
    buf = torch.zeros(args.max_bytes // 4, dtype=torch.float32)
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        t = buf[: nbytes // 4]
        t.zero_()
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            dist.all_reduce(t)
        per_iter = (time.perf_counter() - t0) / max(args.warmup, 1)
        iters = torch.tensor([min(max(int(args.min_time / max(per_iter, 1e-7)), 3), args.max_iters)])
        dist.all_reduce(iters, op=dist.ReduceOp.MAX)
        iters = int(iters.item())

        dist.barrier()
        t0 = time.perf_counter()
        cpu0 = cpu_seconds()
        for _ in range(iters):
            dist.all_reduce(t)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        cpu = torch.tensor([cpu_seconds() - cpu0], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu)
        if dist.get_rank() == 0:
            per = elapsed.item() / iters
            algbw = nbytes / per / 1e9
            print(json.dumps({"impl": "gloo", "transport": "gloo (torch %s)" % torch.__version__, "ranks": n,
                              "bytes": nbytes, "iters": iters, "time_us": per * 1e6,
                              "cpu_ms": cpu.item() / iters * 1e3, "algbw_GBps": algbw,
                              "busbw_GBps": algbw * 2 * (n - 1) / n}), flush=True)
        nbytes *= 4
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
