"""Each epoch, rank 0 writes the checkpoint and every rank loads it back (the weights every rank resumes
from), with no barrier between the save and the loads: ranks 1-3 look for the file before rank 0, which
logs its loss first, has saved it. FileNotFoundError, true but not why: the why is rank 0's save, its line.
(The file is the job's own, in the host's temporary folder: rank 0 removes what it saved as it exits.)

expect: kind=crash; nproc=4; exit=1; headline contains "FileNotFoundError"; headline contains "rank 0 saved checkpoint-";
        headline contains "at ddp_load_before_save.py:32, "; headline contains "after rank";
        report contains "dist.barrier() on every rank"
"""
import atexit
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for epoch in range(3):
    loss = train_step(model, optimizer, x, y)
    path = os.path.join(tempfile.gettempdir(), f"checkpoint-{os.environ['MASTER_PORT']}-{epoch}.pt")
    if rank == 0:
        print(f"epoch {epoch}: loss {loss.item():.3f}", flush=True)
        time.sleep(1)  # (the log's own write: a moment)
        atexit.register(os.remove, path)
        torch.save(model.module.state_dict(), path)
    model.module.load_state_dict(torch.load(path))
dist.destroy_process_group()
