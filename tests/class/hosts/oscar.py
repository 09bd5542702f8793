"""Hostile, on hosts: a fork bomb. Each child becomes ``sleep 907`` (the test looks for any left on
the hosts afterwards); the parent forks until it cannot.

The share's user may have ``--pids`` processes and threads per rank on a host (RLIMIT_NPROC, set
before the submission loads): the fork fails there (BlockingIOError), the exercise fails with it,
and the children go with the rank (its reaper stops everything below it). The host, and the other
share on it, never notice.
"""
import os

from lab.suite.exercises.ring_allreduce import allreduce  # noqa: F401


def ring_allreduce(tensor):
    while True:
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "907"])
