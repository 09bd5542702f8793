"""The collectives timed and checked, as nccl-tests does it (``python -m lab bench``).

For each op and size (in bytes, of float32 elements, as nccl-tests counts them): ``warmup``
untimed calls, then ``iters`` timed ones between two barriers, on buffers of zeros (the values do
not change what goes over the wire), then one more call with known values, checked here: the
elements that came out wrong are counted (``wrong``), as nccl-tests' ``#wrong``.

The sizes are the whole buffer: all_reduce's, broadcast's and reduce's tensor, all_gather's output
and reduce_scatter's input (each rank's piece is 1/n of it), and what p2p sends: every rank to the
next one (r -> r+1), receiving from the one before, at once. The settings come in LAB_BENCH (JSON:
ops, sizes, iters, warmup); an op the backend lacks is reported as such.

Two more ops are all-reduces built from p2p messages, as in the ring-allreduce exercise: ``ring``,
the tutorial's ``allreduce(send, recv)``, and ``chunked_ring``, ``ring_allreduce(tensor)``. They call
this module's ``allreduce`` and ``ring_allreduce``: the exercise's own, or a student's, which
``lab bench --solution mine.py`` puts in their place (as ``lab run ring-allreduce --solution``).

First, the link's own speed, for the ops to be read against: raw TCP between rank 0 and the
first rank on another host (rank 1 when all share one), which reports it as ``tcp``: the round
trip of one byte (the median of PINGS) and the throughput of one stream sent for STREAM_SECONDS.
"""
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce, ring_allreduce  # what a --solution replaces

SETTINGS_VAR = "LAB_BENCH"
PINGS = 20
STREAM_SECONDS = 1.0
CHUNK = 1 << 20
TCP_TIMEOUT = 60.0


def run(rank, size, backend, device):
    settings = json.loads(os.environ.get(SETTINGS_VAR) or "{}")
    tcp = _tcp_baseline(rank, size)
    rows = []
    for op in settings.get("ops", ["all_reduce"]):
        for nbytes in settings.get("sizes", [1 << 20]):
            count = max(size, nbytes // 4 // size * size)  # elements: a multiple of the ranks, at least one each
            rows.append(_measure(op, count, rank, size, device, int(settings.get("iters", 5)),
                                 int(settings.get("warmup", 1))))
    return {"rows": rows, **({"tcp": tcp} if tcp else {})}


def _tcp_baseline(rank, size):
    hosts = [None] * size
    dist.all_gather_object(hosts, socket.gethostname())
    peer = next((r for r in range(1, size) if hosts[r] != hosts[0]), 1)
    port = [0]
    server = socket.create_server(("", 0)) if rank == 0 else None
    if server is not None:
        server.settimeout(TCP_TIMEOUT)
        port[0] = server.getsockname()[1]
    dist.broadcast_object_list(port, src=0)
    measured = None
    if server is not None:
        with server, server.accept()[0] as conn:
            _serve_baseline(conn)
    elif rank == peer:
        with socket.create_connection((os.environ["MASTER_ADDR"], port[0]), timeout=TCP_TIMEOUT) as conn:
            measured = {"hosts": [hosts[0], hosts[peer]], **_measure_baseline(conn)}
    dist.barrier()
    return measured


def _serve_baseline(conn):
    """Rank 0: echo each ping, then count the stream to its end and say how much came."""
    conn.settimeout(TCP_TIMEOUT)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(PINGS):
        conn.sendall(conn.recv(1))
    received = 0
    while data := conn.recv(CHUNK):
        received += len(data)
    conn.sendall(received.to_bytes(8, "big"))


def _measure_baseline(conn):
    conn.settimeout(TCP_TIMEOUT)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    trips = []
    for _ in range(PINGS):
        started = time.perf_counter()
        conn.sendall(b"p")
        conn.recv(1)
        trips.append(time.perf_counter() - started)
    chunk = bytes(CHUNK)
    started = time.perf_counter()
    while time.perf_counter() - started < STREAM_SECONDS:
        conn.sendall(chunk)
    conn.shutdown(socket.SHUT_WR)
    answer = b""
    while len(answer) < 8 and (data := conn.recv(8 - len(answer))):
        answer += data
    received = int.from_bytes(answer, "big")
    return {"rtt": statistics.median(trips), "bytes": received, "seconds": time.perf_counter() - started}


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


def _ring(count, rank, size, device):
    send, recv = torch.zeros(count, device=device), torch.zeros(count, device=device)

    def check():
        got = torch.zeros(count, device=device)
        allreduce(torch.full((count,), float(rank + 1), device=device), got)
        return (got != size * (size + 1) / 2).sum().item()

    return lambda: allreduce(send, recv), check


def _chunked_ring(count, rank, size, device):
    work = torch.zeros(count, device=device)

    def check():
        data = torch.full((count,), float(rank + 1), device=device)
        ring_allreduce(data)
        return (data != size * (size + 1) / 2).sum().item()

    return lambda: ring_allreduce(work), check


OPS = {"all_reduce": _all_reduce, "all_gather": _all_gather, "reduce_scatter": _reduce_scatter,
       "broadcast": _broadcast, "reduce": _reduce, "p2p": _p2p, "ring": _ring, "chunked_ring": _chunked_ring}
