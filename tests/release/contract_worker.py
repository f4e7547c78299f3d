"""A plain Python worker (no torch) for the release's install tests: checks the environment contract a launcher
gives its workers (torchrun's: docs/cli.md) and uses the agent's store the way torch's workers do, over the
TCPStore wire protocol (tests/interop/store_wire_trace.py's RawStore, legacy dialect as torch 1.13).

    python3 contract_worker.py OUT_DIR NNODES NPROC_PER_NODE

Writes OUT_DIR/rank<RANK>.json: {"rank", "local_rank", "group_rank", "world_size", "ticket", "problems"} where
ticket is what ADD 1 on a key every rank of the job shares returned (the ranks' tickets are 1..world_size) and
problems lists each broken part of the contract. Exits 0 when there is none, else 1. Standard library only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
from store_wire_trace import RawStore  # noqa: E402


def main():
    out, nnodes, nproc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    env = os.environ
    problems = []

    def expect(name, check, what):
        value = env.get(name)
        if value is None or not check(value):
            problems.append(f"{name}={value!r}: want {what}")

    world = nnodes * nproc
    expect("WORLD_SIZE", lambda v: v == str(world), str(world))
    expect("LOCAL_WORLD_SIZE", lambda v: v == str(nproc), str(nproc))
    expect("GROUP_WORLD_SIZE", lambda v: v == str(nnodes), str(nnodes))
    expect("RANK", lambda v: v.isdigit() and int(v) < world, f"0..{world - 1}")
    expect("LOCAL_RANK", lambda v: v.isdigit() and int(v) < nproc, f"0..{nproc - 1}")
    expect("GROUP_RANK", lambda v: v.isdigit() and int(v) < nnodes, f"0..{nnodes - 1}")
    expect("ROLE_RANK", lambda v: v == env.get("RANK"), "RANK")
    expect("ROLE_NAME", lambda v: v == "default", "default")
    expect("MASTER_ADDR", lambda v: v != "", "an address")
    expect("MASTER_PORT", lambda v: v.isdigit() and 0 < int(v) < 65536, "a port")
    expect("TORCHELASTIC_RESTART_COUNT", lambda v: v == "0", "0")
    expect("TORCHELASTIC_MAX_RESTARTS", lambda v: v.isdigit(), "a count")
    expect("TORCHELASTIC_RUN_ID", lambda v: v != "", "the run id")
    expect("TORCHELASTIC_USE_AGENT_STORE", lambda v: v in ("True", "False"), "True or False")
    expect("TORCHELASTIC_ERROR_FILE", lambda v: v.endswith("error.json"), "a path to error.json")
    ticket = None
    try:
        with RawStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), "legacy") as store:
            ticket = store.add("/worker/attempt_0/release-contract", 1)
    except (OSError, RuntimeError, KeyError, ValueError) as e:
        problems.append(f"the agent's store at {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}: {e}")
    result = {"rank": int(env.get("RANK", "-1")), "local_rank": int(env.get("LOCAL_RANK", "-1")),
              "group_rank": int(env.get("GROUP_RANK", "-1")), "world_size": int(env.get("WORLD_SIZE", "-1")),
              "ticket": ticket, "problems": problems}
    with open(os.path.join(out, f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)
    for p in problems:
        sys.stderr.write(f"contract_worker rank {result['rank']}: {p}\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
