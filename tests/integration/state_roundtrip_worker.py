"""A worker of test_state.py: one rank saves, with ddprun.state.save(async_=True), a state whose tensors take
every path of the async save's staging copy (a contiguous tensor larger than a copy slice, split across copy
threads; tensors below a slice, batched, three of 20 MiB making two batches; a non-contiguous view; a conjugated complex tensor; bool, bfloat16 and int64 tensors; a 0-d and an
empty tensor), then dies (attempt 0). Restarted (attempt 1), it loads the state and writes OUT: whether every
tensor came back with the same dtype, shape and bytes.

    state_roundtrip_worker.py OUT
"""
import json
import os
import sys

import torch

import ddprun.state


def make_state():
    g = torch.Generator().manual_seed(11)
    big = torch.randn(20 << 20, generator=g)  # 80 MiB: three slices of the copy
    wide = torch.randn(64, 48, generator=g)
    z = torch.complex(torch.randn(100, generator=g), torch.randn(100, generator=g))
    return {
        "big": big,
        "mid0": torch.randn(5 << 20, generator=g),  # 20 MiB each: a batch of two, then one
        "mid1": torch.randn(5 << 20, generator=g),
        "mid2": torch.randn(5 << 20, generator=g),
        "columns": wide[:, ::3],  # not contiguous
        "conj": z.conj(),
        "mask": torch.randn(1000, generator=g) > 0,
        "half": torch.randn(777, generator=g).to(torch.bfloat16),
        "ids": torch.randint(0, 1 << 40, (333,), generator=g),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "meta": {"step": 7, "names": ["a", "b"]},
    }


expected = make_state()
if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
    assert ddprun.state.save(7, expected, async_=True)
    ddprun.state.wait()
    sys.stdout.flush()
    os._exit(1)

got = ddprun.state.load()
assert got is not None, ddprun.state.why_none()
step, state = got
report = {"step": step, "meta": state["meta"] == expected["meta"]}
for key, want in expected.items():
    if isinstance(want, torch.Tensor):
        have = state[key]
        report[key] = (have.dtype == want.dtype and have.shape == want.shape
                       and torch.equal(have.resolve_conj(), want.resolve_conj()))
with open(sys.argv[1], "w") as f:
    json.dump(report, f)
