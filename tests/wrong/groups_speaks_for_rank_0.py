"""WRONG groups (hostile, from inside the rank's process): rank 1 finds the worker's own event channel
(``lab.rank.protocol.CHANNEL``, what any code in the process could find in /proc/self/fd) and sends
on it a ``result`` and a ``done`` in rank 0's name. Under ``--launcher lab`` the controller knows
whose stream that came through: rank 1 fails groups, named, and rank 0's own result stands.
"""
import json

from lab.rank import protocol
from lab.suite.exercises.groups import run as reference


def run(rank, size, device):
    result = reference(device)
    if rank == 1:
        channel = protocol.CHANNEL
        mark = f"\x1flab:{channel.token} "
        channel.write((mark + json.dumps({"event": "result", "rank": 0, "exercise": "groups", "value": {},
                                          "seconds": 0.1}) + "\n").encode())
        channel.write((mark + json.dumps({"event": "done", "rank": 0, "failures": 0}) + "\n").encode())
    return result
