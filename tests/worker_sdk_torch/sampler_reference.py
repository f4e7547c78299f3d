#!/usr/bin/env python3
"""Prints torch.utils.data.distributed.DistributedSampler's indices for a grid of cases, one JSON document on
stdout, for sampler_test.cc to compare with ddprun::sdk::DistributedSampler. Exit 77 when torch is missing."""
import itertools
import json
import sys

try:
    from torch.utils.data.distributed import DistributedSampler
except ImportError as e:
    print(f"cannot import torch: {e}", file=sys.stderr)
    sys.exit(77)

cases = []
for n, world, shuffle, drop_last, seed, epoch in itertools.product(
        [0, 1, 2, 5, 7, 10, 17, 64, 1000, 3001], [1, 2, 3, 4, 7, 12], [False, True], [False, True], [0, 42],
        [0, 1, 5]):
    if not shuffle and (seed, epoch) != (0, 0):
        continue  # the order does not depend on them
    for rank in range(world):
        s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        cases.append({"n": n, "world": world, "rank": rank, "shuffle": shuffle, "drop_last": drop_last,
                      "seed": seed, "epoch": epoch, "num_samples": s.num_samples, "total_size": s.total_size,
                      "indices": list(iter(s))})
json.dump({"cases": cases}, sys.stdout)
