"""WRONG ring all-reduce: the functions are the reference's, and a run() of its own replaces the
driver that calls and checks them, returning whatever it likes.

The exercise asks for allreduce() and ring_allreduce(): a solution that defines run() is refused
before any rank runs it, with one line: "ring_own_run.py defines run(): this exercise asks for
allreduce(), ring_allreduce(), which its own run() drives and checks; remove run()".
"""
from lab.suite.exercises.ring_allreduce import allreduce, ring_allreduce  # noqa: F401


def run(rank, size, device):
    return {}
