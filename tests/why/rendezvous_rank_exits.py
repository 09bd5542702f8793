"""A rank that never joins the rendezvous: rank 2 finds nothing to do and exits (status 0) before
init_process_group, so ranks 0 and 1 wait there for a third rank that never comes.

expect: kind=rendezvous; nproc=3; exit=4; headline contains "wait in init_process_group for rank 2";
        headline contains "exited with status 0 at rendezvous_rank_exits.py:15";
        report contains "rendezvous_rank_exits.py:16"
"""
import os
import sys

import torch
import torch.distributed as dist

if os.environ["RANK"] == "2":
    sys.exit(0)  # "no shard for this rank"
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(8))
dist.destroy_process_group()
