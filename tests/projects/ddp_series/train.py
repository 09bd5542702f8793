"""The launcher script of a small project shaped as pytorch/examples' distributed DDP series
(multinode.py): the trainer and the data live in a package beside it, the settings in a config
file and the data in a file, both found by relative paths. Run as torchrun would run it:
`lab launch [--hosts ...] [--launcher ...] train.py --epochs 2`."""
import argparse
import json
import os

import torch.distributed as dist
from series.data import load_dataset
from series.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    with open("series/conf/config.json") as settings:
        config = json.load(settings)
    dist.init_process_group("gloo")
    trainer = Trainer(load_dataset(config["data"]), config["batch_size"], config["snapshot"])
    trainer.train(args.epochs)
    dist_world = dist.get_world_size()
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        print(f"trained {args.epochs} epoch(s) on {dist_world} rank(s), tag {os.environ.get('SERIES_TAG')}; "
              f"snapshot at {config['snapshot']}: {os.path.exists(config['snapshot'])}")


if __name__ == "__main__":
    main()
