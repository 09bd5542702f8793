"""A trainer shaped like a real one (nanoGPT's way): its settings in a config file, a checkpoint to a
relative out_dir at the end, and ``--init-from resume`` to go on from it. Every rank's batches are
drawn from its rank and the step, so a run of 6 steps and one of 3 resumed to 6 train alike, loss
for loss. Each rank also notes on which host it ran (its own file, different on each host)."""
import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--init-from", choices=("scratch", "resume"), default="scratch")
args = parser.parse_args()
with open("config.json") as f:
    config = json.load(f)
checkpoint = os.path.join(config["out_dir"], "ckpt.pt")

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
start = 0
if args.init_from == "resume":
    state = torch.load(checkpoint)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
ddp = DistributedDataParallel(model)
for step in range(start, args.steps):
    batch = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=batch)
    loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.6f}", flush=True)
os.makedirs(config["out_dir"], exist_ok=True)
if rank == 0:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": args.steps}, checkpoint)
with open(os.path.join(config["out_dir"], "ran-on.txt"), "w") as f:
    f.write(socket.gethostname())
dist.destroy_process_group()
