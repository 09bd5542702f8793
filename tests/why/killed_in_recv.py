"""A rank killed by SIGKILL while it waits in a call (as the kernel's OOM killer ends a rank that a
thread of its made too large): rank 1 waits in recv from 0 while rank 0 prepares the tensor, and
is killed there. A killed rank runs nothing as it dies; its relay tells the call it was in.

expect: kind=crash; nproc=2; exit=1; headline contains "rank 1 (local) failed first: it was killed by SIGKILL
        in recv from 0 of 4 floats at killed_in_recv.py:21"
"""
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.zeros(4)
if rank == 1:
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
    dist.recv(tensor, src=0)
    print(tensor)
else:
    time.sleep(3)  # (preparing the tensor)
    dist.barrier()
dist.destroy_process_group()
