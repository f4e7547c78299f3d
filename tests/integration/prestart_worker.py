"""A DDP (gloo) worker for `ddprun --prestart` (test_pytorch_restarts.PyTorchRestarts.test_prestart).

Records, before importing anything itself, whether torch was already imported (it is in a released standby,
not in a fresh interpreter), then trains one DDP step and writes OUT/attempt<a>_rank<r>.json. On attempts
below FAIL_UNTIL, rank 1 waits until the agent (its parent) has a standby for every local rank, then exits 3
(os._exit), so the next attempt runs in the standbys."""
import sys

PRELOADED = "torch" in sys.modules

import glob  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402


def standbys_of(agent):
    found = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(stat[:-4] + "cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        found += ppid == agent and b"ddprun_prestart.py" in cmdline
    return found


def main():
    out, fail_until = sys.argv[1], int(sys.argv[2])
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()
    grad = model.module.weight.grad.clone()
    dist.all_reduce(grad)
    record = {"rank": rank, "attempt": attempt, "preloaded": PRELOADED, "argv": sys.argv, "name": __name__,
              "path0": sys.path[0], "world": dist.get_world_size(), "env_rank": os.environ["RANK"],
              "pid": os.getpid(), "grad_ok": bool(torch.allclose(grad, 2 * model.module.weight.grad))}
    with open(os.path.join(out, f"attempt{attempt}_rank{rank}.json"), "w") as f:
        json.dump(record, f)
    print(f"rank {rank} attempt {attempt} trained", flush=True)
    dist.barrier()
    if rank == 1 and attempt < fail_until:
        deadline = time.monotonic() + 120
        while standbys_of(os.getppid()) < int(os.environ["LOCAL_WORLD_SIZE"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(3)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
