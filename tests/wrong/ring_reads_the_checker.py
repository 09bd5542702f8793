"""WRONG ring all-reduce: it tries to learn what the checker expects by importing it. Nothing of
the checkers travels to a rank (only the rank side and the exercise programs do), so the import
fails and the exercise is an error, on every host and in the sandbox.
"""
from lab.suite.checks import ring  # noqa: F401  (not there on a rank)


def allreduce(send, recv):
    recv.copy_(send)


def ring_allreduce(tensor):
    pass
