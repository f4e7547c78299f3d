"""A script in the style of torch.distributed.launch's era: it reads its local rank from argparse
(--local-rank or --local_rank, as torch's docs suggest) and writes what it got to $LAUNCH_OUT/rank<RANK>.json:
its arguments, the parsed local rank and $LOCAL_RANK. Standard library only."""
import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", "--local_rank", type=int, default=None)
parser.add_argument("rest", nargs="*")
args = parser.parse_args()
with open(os.path.join(os.environ["LAUNCH_OUT"], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "local_rank": args.local_rank, "LOCAL_RANK": os.environ.get("LOCAL_RANK")}, f)
