"""The collectives timed and checked, as nccl-tests does it (``python -m lab bench``).

For each op and size (in bytes, of float32 elements, as nccl-tests counts them): ``warmup``
untimed calls, then ``iters`` timed ones between two barriers, on buffers of zeros (the values do
not change what goes over the wire), then one more call with known values, checked here: the
elements that came out wrong are counted (``wrong``), as nccl-tests' ``#wrong``.

The sizes are the whole buffer: all_reduce's, broadcast's and reduce's tensor, all_gather's output
and reduce_scatter's input (each rank's piece is 1/n of it), and what p2p sends: every rank to the
next one (r -> r+1), receiving from the one before, at once. The settings come in LAB_BENCH (JSON:
ops, sizes, iters, warmup); an op the backend lacks is reported as such.
"""
import json
import os
import time

import torch
import torch.distributed as dist

SETTINGS_VAR = "LAB_BENCH"


def run(rank, size, backend, device):
    settings = json.loads(os.environ.get(SETTINGS_VAR) or "{}")
    rows = []
    for op in settings.get("ops", ["all_reduce"]):
        for nbytes in settings.get("sizes", [1 << 20]):
            count = max(size, nbytes // 4 // size * size)  # elements: a multiple of the ranks, at least one each
            rows.append(_measure(op, count, rank, size, device, int(settings.get("iters", 5)),
                                 int(settings.get("warmup", 1))))
    return {"rows": rows}


def _measure(op, count, rank, size, device, iters, warmup):
    call, check = OPS[op](count, rank, size, device)
    row = {"op": op, "count": count, "bytes": count * 4}
    try:
        for _ in range(warmup):
            call()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            call()
        row["seconds"] = (time.perf_counter() - started) / iters
        dist.barrier()
        row["wrong"] = int(check())
    except RuntimeError as err:
        if "does not support" not in str(err) and "not supported" not in str(err):
            raise
        row["unsupported"] = str(err).splitlines()[0][:200]
    return row


def _all_reduce(count, rank, size, device):
    work = torch.zeros(count, device=device)

    def check():
        data = torch.full((count,), float(rank + 1), device=device)
        dist.all_reduce(data)
        return (data != size * (size + 1) / 2).sum().item()

    return lambda: dist.all_reduce(work), check


def _all_gather(count, rank, size, device):
    piece = count // size
    mine, out = torch.zeros(piece, device=device), [torch.zeros(piece, device=device) for _ in range(size)]

    def check():
        gathered = [torch.zeros(piece, device=device) for _ in range(size)]
        dist.all_gather(gathered, torch.full((piece,), float(rank + 1), device=device))
        return sum((g != i + 1).sum().item() for i, g in enumerate(gathered))

    return lambda: dist.all_gather(out, mine), check


def _reduce_scatter(count, rank, size, device):
    piece = count // size
    inputs, out = [torch.zeros(piece, device=device) for _ in range(size)], torch.zeros(piece, device=device)

    def check():
        result = torch.zeros(piece, device=device)
        dist.reduce_scatter(result, [torch.full((piece,), float(rank + 1 + i), device=device) for i in range(size)])
        return (result != sum(r + 1 + rank for r in range(size))).sum().item()

    return lambda: dist.reduce_scatter(out, inputs), check


def _broadcast(count, rank, size, device):
    work = torch.zeros(count, device=device)

    def check():
        data = torch.full((count,), 7.0 if rank == 0 else 0.0, device=device)
        dist.broadcast(data, src=0)
        return (data != 7.0).sum().item()

    return lambda: dist.broadcast(work, src=0), check


def _reduce(count, rank, size, device):
    work = torch.zeros(count, device=device)

    def check():
        data = torch.full((count,), float(rank + 1), device=device)
        dist.reduce(data, dst=0)
        return (data != size * (size + 1) / 2).sum().item() if rank == 0 else 0

    return lambda: dist.reduce(work, dst=0), check


def _p2p(count, rank, size, device):
    send, recv = torch.zeros(count, device=device), torch.zeros(count, device=device)
    to, source = (rank + 1) % size, (rank - 1) % size

    def exchange(data, into):
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, data, to), dist.P2POp(dist.irecv, into, source)]):
            request.wait()

    def check():
        got = torch.zeros(count, device=device)
        exchange(torch.full((count,), float(rank + 1), device=device), got)
        return (got != source + 1).sum().item()

    return lambda: exchange(send, recv), check


OPS = {"all_reduce": _all_reduce, "all_gather": _all_gather, "reduce_scatter": _reduce_scatter,
       "broadcast": _broadcast, "reduce": _reduce, "p2p": _p2p}
