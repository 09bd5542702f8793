"""Correct, but floods its output: 64 MiB per rank."""
import sys

from lab.suite.exercises.ring_allreduce import allreduce
from lab.suite.exercises.ring_allreduce import ring_allreduce as reference_ring

flooded = False


def ring_allreduce(tensor):
    global flooded
    if not flooded:
        flooded = True
        line = "x" * 1023 + "\n"
        for _ in range(64 * 1024):
            sys.stdout.write(line)
        sys.stdout.flush()
    reference_ring(tensor)


__all__ = ["allreduce", "ring_allreduce"]
