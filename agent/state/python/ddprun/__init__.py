"""ddprun's Python side for the workers it starts.

ddprun.state: training state kept in the agents' memory and copied to a neighbour node (docs/state.md).
ddprun writes this package into the run directory of every job started with --state_memory and puts it on the
workers' PYTHONPATH, so `import ddprun.state` needs no install.
"""
