"""Machine to machine across two VPCs: MASTER_ADDR is the master's external address.

From "Machine-to-Machine Communication" (tutorial 000): MASTER_ADDR must be an address the
other machines can reach, and the master must also know it is that address. Between two
VPCs (two cloud accounts), a VM does not know its external address: `ip addr` shows only
the private one. init_process_group gets through the store at the master's external
address, and then every rank tells the others to reach it at its private address, which
they cannot: the full mesh hangs. This program shows both steps apart.
"""
import datetime
import os
import socket

import torch
import torch.distributed as dist


def run(rank, size, device, backend):
    master, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    # 1) The store: rank 0 serves it; every rank connects to MASTER_ADDR:MASTER_PORT.
    store = dist.TCPStore(master, port, size, is_master=(rank == 0),
                          timeout=datetime.timedelta(seconds=120))
    # What this machine believes its address is, and so what gloo advertises to its peers.
    mine = socket.gethostbyname(socket.gethostname())
    store.set(f"advertised/{rank}", mine)
    print(f"rank {rank}: connected to the store at {master}:{port}; I advertise {mine}", flush=True)

    # 2) The mesh: every rank connects to every other rank's advertised address.
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    total = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(total)
    print(f"rank {rank}: all_reduce over the mesh gives {total.item()}")
    advertised = [store.get(f"advertised/{r}").decode() for r in range(size)]
    dist.destroy_process_group()
    return {"sum": total.item(), "advertised": advertised, "master": master}
