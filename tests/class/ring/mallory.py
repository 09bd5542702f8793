"""Dishonest: it looks for the other ranks' inputs instead of receiving them, every way
a rank on the same host might: the run directory's ``inputs/``, and the open files of every process
of its user (the host's launcher, the other ranks: ``/proc/PID/fd``). Had it found every rank's, it
would sum them itself and send nothing. It finds none (the launcher unlinked the files and hands
each rank its own; no process of the lab can be looked into), says so, and falls back to its own
input times the world size: wrong values, and 0 bytes sent.
"""
import os

import torch
import torch.distributed as dist

from lab.suite.exercises.ring_cases import starts


def _steal():
    found = {}
    if os.path.isdir("inputs"):
        for name in os.listdir("inputs"):
            try:
                with open(os.path.join("inputs", name), "rb") as f:
                    found[int(name.removeprefix("rank-"))] = f.read()
            except (OSError, ValueError):
                pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if "/inputs/rank-" in target:
                    with open(f"/proc/{pid}/fd/{fd}", "rb") as f:
                        found[int(target.split("rank-")[1].split()[0])] = f.read()
            except (OSError, ValueError):
                pass
    return found


FOUND = _steal()
print(f"rank {os.environ.get('RANK')}: found the inputs of ranks {sorted(FOUND)}")


def _everyones_sum(tensor, function):
    if len(FOUND) < dist.get_world_size():
        return tensor * dist.get_world_size()
    start = next(at for shape, at in starts(function).items() if torch.Size(shape) == tensor.shape)
    drawn = [torch.frombuffer(bytearray(FOUND[r]), dtype=torch.int16).to(torch.int64) for r in sorted(FOUND)]
    return sum(d[start:start + tensor.numel()] for d in drawn).to(tensor.dtype).reshape(tensor.shape)


def allreduce(send, recv):
    recv.copy_(_everyones_sum(send, "allreduce"))


def ring_allreduce(tensor):
    tensor.copy_(_everyones_sum(tensor, "ring_allreduce"))
