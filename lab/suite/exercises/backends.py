"""Communication backends: which ones each host has, and collectives on the one the run uses.

From "Communication Backends" (통신 백엔드) of the official tutorial (001/004):

* **gloo** ships with every PyTorch binary (Linux, macOS): every point-to-point and
  collective operation on CPU tensors, the collectives on CUDA tensors (less optimised
  than NCCL's);
* **nccl** ships with the CUDA builds: collectives on CUDA tensors, the fastest there; one
  GPU per rank;
* **mpi** needs PyTorch built from source against an MPI (Open-MPI, MVAPICH2, Intel MPI),
  and ``mpirun`` starts the processes.

The lab forms the default group with nccl when every rank has its own GPU (each rank's
device is ``cuda:<local rank>``), else with gloo on CPU; ``--backend`` overrides it, and
``--backend nccl`` on a host with fewer GPUs than slots is refused before anything starts.
The same collectives run either way. A gloo group on CPU tensors can sit beside an nccl
default group (``dist.new_group(backend="gloo")``): the last one shows that.

What changed since the tutorial (004): ``init_process_group(backend='tcp')`` is gone: the
TCP backend was removed in PyTorch 1.0; use ``"gloo"`` (``tcp://ADDR:PORT`` survives as an
*init method*, not a backend). ``dist.reduce_op.SUM`` is now ``dist.ReduceOp.SUM``. To move
the tutorial's SGD to GPUs: ``device = torch.device(f"cuda:{local_rank}")``,
``model = Net().to(device)``, ``data, target = data.to(device), target.to(device)``.
"""
import socket

import torch
import torch.distributed as dist


def run(rank, size, local_rank, device):
    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                 "mpi": dist.is_mpi_available()}
    gpus = torch.cuda.device_count()
    backend = dist.get_backend()  # the default group's: nccl when every rank has its own GPU
    print(f"rank {rank} on {socket.gethostname()}: available {available}, {gpus} GPU(s); "
          f"the collectives run with {backend} on {device}")

    # The same collectives on either backend: only the tensors' device differs.
    total = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)  # was dist.reduce_op.SUM in the tutorial
    last = size - 1
    announced = torch.tensor([100.0 * rank + 1, 100.0 * rank + 2], device=device)
    dist.broadcast(announced, src=last)
    gathered = [torch.zeros(1, device=device) for _ in range(size)]
    dist.all_gather(gathered, torch.tensor([float(rank)], device=device))

    # gloo on CPU tensors, whatever the default group's backend: a group of its own when
    # the default one is not gloo (new_group is collective: every rank calls it).
    cpu_group = None if backend == "gloo" else dist.new_group(backend="gloo")
    on_cpu = torch.tensor([float(rank * rank)])
    dist.all_reduce(on_cpu, op=dist.ReduceOp.SUM, group=cpu_group)

    return {"hostname": socket.gethostname(), "available": available, "gpus": gpus,
            "backend": backend, "device": str(device), "local_rank": local_rank,
            "all_reduce": total.item(), "broadcast": announced.tolist(),
            "all_gather": [t.item() for t in gathered], "gloo_cpu_all_reduce": on_cpu.item()}
