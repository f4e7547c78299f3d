"""ddprun, installed as a wheel: the programs ddprun, ddprun-store and ddprun-launch on the environment's PATH.

This package holds no Python API; `python -m ddprun ...` runs the ddprun program (ddprun.__main__)."""
from ddprun._build import COMMIT, VERSION

__all__ = ["COMMIT", "VERSION"]
