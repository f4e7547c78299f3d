"""ddprun, installed as a wheel: the programs ddprun, ddprun-store and ddprun-launch on the environment's PATH.

`python -m ddprun ...` runs the ddprun program (ddprun.__main__). ddprun.state (and ddprun.checkpoint, which it
exports for torch.distributed.checkpoint) is the workers' API of the training state in the agents' memory
(docs/state.md); ddprun also writes it into the run directory of every job started with --state_memory, so its
workers need no install."""
from ddprun._build import COMMIT, VERSION

__all__ = ["COMMIT", "VERSION"]
