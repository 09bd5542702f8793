"""Dishonest: a run() of her own in place of the driver that calls and checks the functions. The
exercise asks for functions: the file is refused before any rank runs it ("defines run()")."""
from lab.suite.exercises.ring_allreduce import allreduce, ring_allreduce  # noqa: F401


def run(rank, size, device):
    return {}
