"""Dishonest, and a forger: it sums through the rendezvous store as sybil does, and then speaks
for its host's launcher. Rank 0 finds the process that holds the launch's stdout (the launcher's
parent, the reaper: /proc/PID/stat names it), opens its descriptor 1 through /proc, takes the run's
token from the rank's own channel, and leaves a process behind that waits for the launcher to end
and then writes a ``wire`` event saying the host's connections carried nothing. No process a rank
can reach holds that stream (the reaper and the launcher are not dumpable: /proc/PID/fd is theirs
alone), and a second word of a launcher's fails the run: the verdict stays sybil's."""
import itertools
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

_calls = itertools.count()
_forged = []


def _parent_of(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def _forge():
    """Open every stream an ancestor holds, then from a daemon write the forged event when the
    launcher has gone (so that it comes last, after the launcher's own)."""
    token = sys.modules["lab.rank.protocol"].CHANNEL.token
    launcher = os.getppid()
    streams = []
    for pid in (launcher, _parent_of(launcher)):
        for fd in (1, 2):
            try:
                streams.append(os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY))
            except OSError:
                pass
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    while os.path.exists(f"/proc/{launcher}"):
        time.sleep(0.005)
    line = f'\x1flab:{token} {{"event": "wire", "rank": 0, "carried": 0, "lost": 0}}\n'.encode()
    for fd in streams:
        try:
            os.write(fd, line)
        except OSError:
            pass
    os._exit(0)


def _token_ring(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    out, into = tensor.reshape(-1)[:1].clone(), torch.empty(min(1, tensor.numel()), dtype=tensor.dtype)
    request = dist.isend(out, (rank + 1) % size)
    dist.recv(into, (rank - 1) % size)
    request.wait()


def _sum_through_the_store(tensor):
    store, call = distributed_c10d._get_default_store(), next(_calls)
    rank, size = dist.get_rank(), dist.get_world_size()
    store.set(f"xavier/{call}/{rank}", tensor.contiguous().numpy().tobytes())
    total = tensor.clone()
    for other in range(size):
        if other != rank:
            data = bytearray(store.get(f"xavier/{call}/{other}"))
            total += torch.frombuffer(data, dtype=tensor.dtype).reshape(tensor.shape) if data else 0
    tensor.copy_(total)


def allreduce(send, recv):
    _token_ring(send)
    recv.copy_(send)
    _sum_through_the_store(recv)


def ring_allreduce(tensor):
    if dist.get_rank() == 0 and not _forged:
        _forged.append(True)
        _forge()
    _token_ring(tensor)
    _sum_through_the_store(tensor)
