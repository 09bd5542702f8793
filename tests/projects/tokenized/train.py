"""A trainer that needs a package the hosts do not have: its tokenizer (``labtok``, named in its
requirements.txt, a wheel beside it that the tests build). Its settings in a config file, its text in
data/, a checkpoint to a relative out_dir at the end and ``--init-from resume`` to go on from it, as
nanoGPT's. Every rank's batches are drawn from its rank and the step, so a run of 4 steps and one of
2 resumed to 4 train alike, loss for loss."""
import argparse
import gc
import json
import os

import labtok
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
with open(config["data"], encoding="utf-8") as f:
    tokens = torch.tensor(labtok.encode(f.read()))

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(labtok.VOCAB, 16), torch.nn.Linear(16, labtok.VOCAB))
optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
start = 0
if args.init_from == "resume":
    state = torch.load(checkpoint)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
ddp = DistributedDataParallel(model)
for step in range(start, args.steps):
    batch = torch.Generator().manual_seed(1000 * step + rank)
    at = torch.randint(0, len(tokens) - 1, (config["batch_size"],), generator=batch)
    loss = torch.nn.functional.cross_entropy(ddp(tokens[at]), tokens[at + 1])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.6f} (labtok {labtok.__version__} from {labtok.__file__})", flush=True)
os.makedirs(config["out_dir"], exist_ok=True)
if rank == 0:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": args.steps}, checkpoint)
# DDP let go first, so that the group is destroyed here and not at exit: under torch 2.13's torchrun a
# gloo thread that drops DDP's last all-reduce while the interpreter finalizes aborts the rank
# ("terminate called without an active exception"), 7 runs in 20 on this machine.
del ddp
gc.collect()
dist.destroy_process_group()
