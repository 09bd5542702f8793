"""A rank that never joins the rendezvous because it is busy: rank 2 waits 10 minutes for its data
before init_process_group, so ranks 0 and 1 wait there for it. Rank 2 is in no torch.distributed
call: this is a straggler, not a hang; the report comes at the timeout and names rank 2.

expect: kind=rendezvous; nproc=3; exit=4; timeout=20; headline contains "wait in init_process_group for rank 2";
        report contains "rendezvous_rank_sleeps.py:15"; report contains "rendezvous_rank_sleeps.py:16"
"""
import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "2":
    time.sleep(600)  # "waiting for the dataset"
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(8))
dist.destroy_process_group()
