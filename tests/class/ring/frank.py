"""Correct, but leaves daemons behind: a new session and a double fork."""
import os
import subprocess
import time

import torch
import torch.distributed as dist

started = False


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


def _ring(tensor):
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


def ring_allreduce(tensor):
    global started
    if not started:
        started = True
        subprocess.Popen(["sleep", "900"], start_new_session=True)
        if os.fork() == 0:  # the classic daemon: fork, setsid, fork again, parent exits
            os.setsid()
            if os.fork() == 0:
                time.sleep(900)
            os._exit(0)
    _ring(tensor)
