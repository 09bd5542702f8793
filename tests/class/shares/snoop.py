"""A correct ring that first looks for the run of the submission graded beside it on the same
host: it fails (raises) if it can read that run's directory (the other student's code, its
token), or if no other run shows up. Graded twice at once on one host, each copy passes only
when the shares run as different users. Once it has seen the other's run it leaves a mark in
its own and waits for the other's, so that neither copy ends before the other has looked."""
import os
import time

import torch
import torch.distributed as dist

WAIT = 20.0  # seconds to wait for the other share's run to appear
MARK = "seen-you"  # left in this run's directory once it has seen the other's
snooped = False


def _snoop():
    global snooped
    if snooped or dist.get_rank() != 0:
        return
    snooped = True
    mine = os.getcwd()  # the run directory
    parent, prefix = os.path.dirname(mine), os.path.basename(mine)[:len("lab-run-")]
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        others = [os.path.join(parent, d) for d in os.listdir(parent)
                  if d.startswith(prefix) and os.path.join(parent, d) != mine]
        for other in others:
            try:
                seen = os.listdir(other)
            except PermissionError:
                continue
            except FileNotFoundError:  # it just ended
                continue
            raise RuntimeError(f"read another share's run {other}: {sorted(seen)}")
        strangers = [o for o in others if os.path.exists(o) and os.stat(o).st_uid != os.getuid()]
        if strangers:
            _stay_until_seen(mine, strangers, deadline)
            return
        time.sleep(0.2)
    raise RuntimeError(f"no run of another user showed up in {parent} within {WAIT:g}s")


def _stay_until_seen(mine, strangers, deadline):
    """Stay until the other share has seen this run too (its mark), or has ended: a copy that
    finished at once could be gone before the other one looks."""
    os.chmod(mine, 0o711)  # (the other may look for the mark; listing the directory stays denied)
    open(os.path.join(mine, MARK), "w").close()
    while time.monotonic() < deadline and not any(
            os.path.exists(os.path.join(o, MARK)) or not os.path.exists(o) for o in strangers):
        time.sleep(0.2)


def ring_allreduce(tensor):
    _snoop()
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    chunks = list(torch.tensor_split(tensor.view(-1), size))
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


def allreduce(send, recv):
    _snoop()
    recv.copy_(send)
    ring_allreduce(recv)
