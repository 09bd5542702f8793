"""Launchers: who starts the ranks, and what each rank is told.

The tutorials start their ranks three ways, and the lab can do each across hosts
(``python -m lab run launchers --launcher lab|torchrun|spawn``):

* the lab starts every rank itself with the rendezvous in its environment (``--launcher lab``,
  the default), as a cluster's job scheduler would;
* ``torchrun`` on every host (tutorial 002: ``torchrun --nnodes=2 --nproc_per_node=2 ...``): the
  hosts' torchruns meet in a c10d rendezvous on rank 0's host (``--rdzv-endpoint``), number the
  hosts (GROUP_RANK) and the ranks themselves, and each starts its host's ranks;
* ``mp.spawn`` on every host (tutorials 000/001: ``mp.spawn(init_process, nprocs=size)``): one
  process per host starts that host's ranks and gives each its number.

Whichever it is, a rank reads the same four variables:

* RANK: the rank in the whole job, 0 .. WORLD_SIZE - 1; the ranks of one host are consecutive;
* LOCAL_RANK: the rank on its host, 0 .. LOCAL_WORLD_SIZE - 1: it picks the GPU, cuda:LOCAL_RANK;
* WORLD_SIZE: how many ranks the job has; LOCAL_WORLD_SIZE: how many run on this host.

torchrun also sets GROUP_RANK (the host's number) and points MASTER_ADDR and MASTER_PORT at the
store its agent keeps on rank 0's host. The process group was formed (env://) from these.
"""
import os

import torch.distributed as dist

VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def run():
    env = {name: os.environ.get(name) for name in VARIABLES}
    rank, size = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {size}: " + " ".join(f"{k}={v}" for k, v in env.items() if v is not None))
    # The process that started this rank, which all of the host's ranks share: the lab's zygote,
    # the host's torchrun agent or its mp.spawn parent.
    return {"rank": rank, "world_size": size, "env": env, "pid": os.getpid(), "parent": os.getppid()}
