"""A worker that behaves differently per local rank and per restart attempt, for ddprun's integration tests.

    python3 rank_worker.py '{"fake_worker": PATH, "rules": [RULE, ...]}'

The first rule that matches LOCAL_RANK and TORCHELASTIC_RESTART_COUNT (set by the agent) is applied; no match
exits 0. A rule is an object with, all optional:
    "rank": N | [N, ...]        local ranks it applies to (default: all)
    "attempt": N | [N, ...]     restart attempts it applies to (default: all)
    "append": PATH              append "rank<LOCAL_RANK> attempt<ATTEMPT>\\n" to PATH
    "stderr": TEXT              write TEXT to stderr
    "wait_for": PATH            poll (at most 60 s) until PATH exists; exit 98 if it never does
    "args": [...]               then exec fake_worker with these arguments (same pid), else
    "exit": N                   exit with N (default 0)
Standard library only; no shell.
"""
import json
import os
import sys
import time


def matches(value, wanted):
    if wanted is None:
        return True
    return value in (wanted if isinstance(wanted, list) else [wanted])


def main():
    spec = json.loads(sys.argv[1])
    rank = int(os.environ["LOCAL_RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    for rule in spec["rules"]:
        if matches(rank, rule.get("rank")) and matches(attempt, rule.get("attempt")):
            break
    else:
        return 0
    if "append" in rule:
        with open(rule["append"], "a") as f:
            f.write(f"rank{rank} attempt{attempt}\n")
    if "stderr" in rule:
        os.write(2, rule["stderr"].encode())
    if "wait_for" in rule:
        deadline = time.monotonic() + 60
        while not os.path.exists(rule["wait_for"]):
            if time.monotonic() > deadline:
                return 98
            time.sleep(0.02)
    if "args" in rule:
        fake = spec["fake_worker"]
        os.execv(fake, [fake] + [str(a) for a in rule["args"]])
    return int(rule.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main())
