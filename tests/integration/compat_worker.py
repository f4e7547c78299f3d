"""A worker for the side-by-side tests against torchrun (test_torchrun_compat.py, test_pytorchjob_netns.py): what
it prints and does depends only on its environment, so ddprun's and torchrun's runs are compared byte for byte.

    python3 compat_worker.py

COMPAT_OUT names a directory for its files; COMPAT_MODE is a comma-separated list of:
    lines       a JSON line on stdout ({"rank": R, "local_rank": L, "world_size": W}), "err <L>" on stderr
    env         writes COMPAT_OUT/env-<L>.json: the launcher's variables the tests compare
    progress    local rank 0 writes "\\r10%" (no newline), waits (at most 60 s) for COMPAT_OUT/go, writes
                "\\r20%" and "\\n": a tqdm bar's two updates and its end
    gloo        init_process_group("gloo") (the store at MASTER_ADDR:MASTER_PORT), an all_reduce of the ranks,
                {"world_size": W, "sum": S} on stdout (every rank: the same line whatever rank a node gets)
    raise:R     rank R raises ValueError under torch's @record (error file, exit 1; after gloo's all_reduce
                when gloo is asked for too); the other ranks wait (at most 120 s) to be stopped, as ranks
                blocked in a collective do, so that rank R is the only failure (a rank that failed on the lost
                connection would be a second one, and which one is the root cause a race)
    wait        writes COMPAT_OUT/pid-<R> ("<pid>\\n", R the global rank), then waits (at most 120 s) to be
                killed or stopped
    save_on_term  with wait: on SIGTERM prints "rank R: checkpoint saved" and exits 0 (a preemption handler)
Exit 0 unless a mode says otherwise. Standard library only, but for gloo and the rank that raises (torch).
"""
import json
import os
import signal
import sys
import time

MODES = [m for m in os.environ.get("COMPAT_MODE", "").split(",") if m]
OUT = os.environ.get("COMPAT_OUT", ".")
RANK = int(os.environ["RANK"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
ENV_KEYS = ("MASTER_ADDR", "TORCHELASTIC_RUN_ID", "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "WORLD_SIZE", "RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "ROLE_NAME")


def wait_for(path, seconds):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def on_term(signum, frame):
    print(f"rank {RANK}: checkpoint saved", flush=True)
    sys.exit(0)


def main():
    raiser = next((int(m.split(":")[1]) for m in MODES if m.startswith("raise:")), None)
    if "lines" in MODES:
        print(json.dumps({"rank": RANK, "local_rank": LOCAL_RANK, "world_size": int(os.environ["WORLD_SIZE"])}),
              flush=True)
        print(f"err {LOCAL_RANK}", file=sys.stderr, flush=True)
    if "env" in MODES:
        with open(os.path.join(OUT, f"env-{LOCAL_RANK}.json"), "w") as f:
            json.dump({k: os.environ.get(k) for k in ENV_KEYS}, f)
    if "progress" in MODES and LOCAL_RANK == 0:
        sys.stdout.write("\r10%")
        sys.stdout.flush()
        wait_for(os.path.join(OUT, "go"), 60)
        sys.stdout.write("\r20%")
        sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    if "gloo" in MODES:
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        total = torch.tensor([RANK])
        dist.all_reduce(total)
        print(json.dumps({"world_size": dist.get_world_size(), "sum": int(total.item())}), flush=True)
        if raiser is None:
            dist.destroy_process_group()
    if raiser is not None:
        if RANK == raiser:
            explode()
        time.sleep(120)
    if "wait" in MODES:
        if "save_on_term" in MODES:
            signal.signal(signal.SIGTERM, on_term)
        path = os.path.join(OUT, f"pid-{RANK}")
        with open(path + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(path + ".tmp", path)
        time.sleep(120)


def explode():
    raise ValueError(f"compat_worker rank {RANK} failed on purpose")


if __name__ == "__main__":
    if f"raise:{RANK}" in MODES:
        from torch.distributed.elastic.multiprocessing.errors import record
        main = record(main)
    main()
