# Hides torch from the light test workers' interpreter (light_train.py): the tests put this directory on their
# PYTHONPATH, so that the standbys of `ddprun --prestart` (agent/process/prestart_stub.py), which import torch
# ahead of need, find none and wait at once instead of spending seconds of CPU on an import nobody uses.
raise ImportError("torch is hidden from this light worker (tests/integration/without_torch)")
