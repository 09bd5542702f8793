"""WRONG groups (hostile): each rank tries to keep itself alive forever with ``step`` events, rank 0
by printing them (with the run's token, from /proc/self/environ), rank 1 on the worker's own channel
(``lab.rank.protocol.CHANNEL``, from inside the process). Neither extends the exercise's deadline:
both are stopped at the step timeout, as a timeout of groups.
"""
import json
import time

from lab.rank import protocol


def token():
    with open("/proc/self/environ", "rb") as environ:
        items = environ.read().split(b"\0")
    for item in items:
        if item.startswith(b"LAB_TOKEN="):
            return item.split(b"=", 1)[1].decode()
    return ""


def run(rank):
    while True:
        for step in ("groups", "wait:groups", "init:env"):
            line = f"\x1flab:{token()} " + json.dumps({"event": "step", "rank": rank, "step": step}) + "\n"
            if rank == 0:
                print(line, end="", flush=True)
            else:
                protocol.CHANNEL.write(line.encode())
            time.sleep(0.1)
