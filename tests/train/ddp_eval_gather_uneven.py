"""Evaluation that gathers every rank's confident predictions for the log, as a detection or retrieval
model's does: each rank keeps the predictions over its threshold, so each has its own number of them,
and all_gather's tensor_list is made like the rank's own (torch.zeros_like), never from the others'
counts. Ranks with 30 expect 30 from the ranks with 31, which send 31: gloo aborts the ones that
receive more than they made room for. The records show every pair that does not meet.

expect: kind=collective-mismatch; nproc=4; exit=1; headline contains "sizes of all_gather #";
        headline contains "at ddp_eval_gather_uneven.py:27 do not meet"; headline contains "(tensor_list[";
        report contains "tensor_list sizes ["; report contains "all_gather the counts first"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, loader, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader(dataset(128)):
    train_step(model, optimizer, x, y)
with torch.no_grad():
    x, _ = dataset(32, seed=1 + rank)[:]
    confidence = model(x).softmax(1).max(1).values
kept = confidence[confidence > 0.3]  # the confident ones: a number of the rank's own
gathered = [torch.zeros_like(kept) for _ in range(world)]
dist.all_gather(gathered, kept)
if rank == 0:
    print(f"{sum(len(g) for g in gathered)} confident predictions", flush=True)
dist.destroy_process_group()
