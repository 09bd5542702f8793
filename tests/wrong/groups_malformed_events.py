"""WRONG groups (hostile, from inside the rank's process): each rank sends the controller, on the
worker's own channel (``lab.rank.protocol.CHANNEL``), an event line that is no event: rank 0 a
JSON list, rank 1 a ``step`` without its step, rank 2 a ``result`` whose seconds are a string,
rank 3 100000 nested lists. Each is that rank's failure, named; the controller carries on.
"""
import json

from lab.rank import protocol
from lab.suite.exercises.groups import run as reference

BAD = {
    0: "[1]",
    1: json.dumps({"event": "step"}),
    2: json.dumps({"event": "result", "rank": 2, "exercise": "groups", "value": 1, "seconds": "soon"}),
    3: "[" * 100_000,
}


def run(rank, device):
    result = reference(device)
    channel = protocol.CHANNEL
    channel.write(f"\x1flab:{channel.token} {BAD[rank]}\n".encode())
    return result
