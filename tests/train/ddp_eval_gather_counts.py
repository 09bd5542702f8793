"""The same evaluation written for NCCL, which gathers uneven sizes: the counts are gathered first and
each rank's tensor_list sized from them, so every pair meets; but the job runs on gloo (CPU), which
gathers equal sizes only and refuses the call on every rank. The sizes are right; the backend is not.

expect: kind=collective-mismatch; nproc=4; exit=1; headline contains "sizes of all_gather #";
        headline contains "at ddp_eval_gather_counts.py:28"; headline contains "and meet";
        headline contains "gloo gathers equal sizes only"; report contains "pad every rank's tensor to the largest"
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
count = torch.tensor([len(kept)])
counts = [torch.zeros_like(count) for _ in range(world)]
dist.all_gather(counts, count)
gathered = [torch.zeros(int(n)) for n in counts]
dist.all_gather(gathered, kept)
if rank == 0:
    print(f"{sum(len(g) for g in gathered)} confident predictions", flush=True)
dist.destroy_process_group()
