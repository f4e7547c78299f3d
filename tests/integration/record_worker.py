"""A PyTorch worker whose main() is decorated with torch's @record
(torch.distributed.elastic.multiprocessing.errors.record), for tests/integration/test_pytorch_errors.py.

    python3 record_worker.py '{"out": DIR, "fail": {"<LOCAL_RANK>": MODE, ...}}'

Every worker first writes DIR/torch-<LOCAL_RANK>.txt (the torch version it imported); a worker with a MODE
waits (at most 60 s) until every local rank has written its file. Then by its MODE:
    (none)          waits, at most 120 s, for the agent to stop it (SIGTERM: no error file)
    "raise"         raises ValueError("record_worker rank <R> failed on purpose") in explode(): @record writes
                    the error file ($TORCHELASTIC_ERROR_FILE) and the worker exits 1
    "raise_linger"  raises as "raise", then lingers in an atexit handler until the agent's SIGTERM arrives (the
                    agent has seen another rank fail first; at most LINGER s) and exits 1: its error file is
                    older than its exit
    "raise_after:N" waits (at most 60 s) until local rank N's error file exists and the clock has passed the
                    next whole second after its timestamp (error files have whole seconds), then raises as
                    "raise" and exits at once: a later error file, but the first exit
"""
import atexit
import json
import math
import os
import signal
import sys
import time

import torch
from torch.distributed.elastic.multiprocessing.errors import record

LINGER = 60  # seconds at most: the agent's SIGTERM (after the "raise_after" rank's exit) ends the linger
stopped = False  # "raise_linger": the agent's SIGTERM arrived


def on_sigterm(signum, frame):
    global stopped
    stopped = True


def linger():
    deadline = time.monotonic() + LINGER
    while not stopped and time.monotonic() < deadline:
        time.sleep(0.02)


def explode(rank):
    raise ValueError(f"record_worker rank {rank} failed on purpose")


def error_file_of(local_rank):
    """Local rank N's error file: .../attempt_<n>/<N>/error.json, beside this worker's own."""
    own = os.environ["TORCHELASTIC_ERROR_FILE"]
    return os.path.join(os.path.dirname(os.path.dirname(own)), str(local_rank), "error.json")


def wait_for(path, parse=lambda f: f.read()):
    """parse(open file) once `path` exists and parses; TimeoutError after 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                return parse(f)
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.02)
    raise TimeoutError(f"{path} did not appear within 60 s")


@record
def main():
    spec = json.loads(sys.argv[1])
    rank = int(os.environ["LOCAL_RANK"])
    with open(os.path.join(spec["out"], f"torch-{rank}.txt"), "w") as f:
        f.write(torch.__version__)
    mode = spec["fail"].get(str(rank))
    if mode is None:
        time.sleep(120)
        return
    # Fail only once every local rank runs (has written its file): the others are then stopped mid-run.
    for lr in range(int(os.environ["LOCAL_WORLD_SIZE"])):
        wait_for(os.path.join(spec["out"], f"torch-{lr}.txt"))
    if mode == "raise_linger":
        signal.signal(signal.SIGTERM, on_sigterm)
        atexit.register(linger)
    elif mode.startswith("raise_after:"):
        other = wait_for(error_file_of(int(mode.split(":")[1])), json.load)
        not_before = math.floor(float(other["message"]["extraInfo"]["timestamp"])) + 1.2
        time.sleep(max(0.0, not_before - time.time()))
    elif mode != "raise":
        raise SystemExit(f"unknown mode {mode!r}")
    explode(rank)


if __name__ == "__main__":
    main()
