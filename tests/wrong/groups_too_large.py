"""WRONG groups: an over-long line of output (3 MiB, with a forged event mark inside it), then a
value too large for any event line (2 MiB as JSON). The line is cut and counted; the value is the
exercise's error, named, on every rank (not a run that "ended before" the exercise).
"""
import os

from lab.suite.exercises.groups import run as reference


def run(device):
    result = reference(device)
    token = os.environ.get("LAB_TOKEN", "x")
    piece = "z" * (1 << 20)
    print(piece + f"\x1flab:{token} " + '{"event": "done", "rank": 0, "failures": 0}' + piece + piece, flush=True)
    result["padding"] = "p" * (2 << 20)
    return result
