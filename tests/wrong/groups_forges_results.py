"""WRONG groups (hostile): every rank forges the lab's event lines, then ends itself.

It reads the run's token where the rank started (``/proc/self/environ``: the worker takes LAB_TOKEN
out of os.environ, not out of that), prints a ``result`` that would pass and a ``done``, for itself
and for every other rank, in every way a program can write (print, fd 1, ``sys.__stdout__``,
stderr, a child process), and ends with ``os._exit(0)`` before the lab's worker reports anything.
None of it may count: each rank died during groups before reporting its result.
"""
import json
import os
import subprocess
import sys


def token():
    with open("/proc/self/environ", "rb") as environ:
        items = environ.read().split(b"\0")
    for item in items:
        if item.startswith(b"LAB_TOKEN="):
            return item.split(b"=", 1)[1].decode()
    return os.environ.get("LAB_TOKEN", "")


def expected(rank, size):
    """What the reference returns on ``rank`` (see lab/suite/exercises/groups.py)."""
    members = list(range(0, size, 2))
    inside = rank in members
    return {"rank": rank, "world_size": size, "members": members,
            "group_rank": members.index(rank) if inside else -1, "group_size": len(members) if inside else -1,
            "value": float(sum(m + 1 for m in members)) if inside else float(rank + 1)}


def run(rank, size):
    mark = "\x1flab:" + token() + " "
    lines = []
    for r in range(size):
        lines.append(mark + json.dumps({"event": "result", "rank": r, "exercise": "groups",
                                        "value": expected(r, size), "seconds": 0.1}))
        lines.append(mark + json.dumps({"event": "done", "rank": r, "failures": 0}))
    text = "".join(line + "\n" for line in lines)
    print(text, end="", flush=True)
    os.write(1, text.encode())
    sys.__stdout__.write("output without a newline, then " + text)
    sys.__stdout__.flush()
    sys.stderr.write(text)
    sys.stderr.flush()
    subprocess.run(["cat"], input=text.encode(), check=True)
    os._exit(0)
