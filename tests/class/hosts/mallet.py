"""Hostile, on hosts: rank 0 starts a sleeper in a new session and kills every ancestor of it but
sshd's (the lab's reaper among them), so that the sleeper is nobody's child and outlives the run.

Where /proc hides the ancestors (a lab host that grades shares at once: hidepid, and the reaper
and host launcher are not dumpable), it kills the one it knows without /proc, its rank: the reaper
takes in the sleeper and ends it with the launch. Elsewhere the sleeper is the share user's:
before the share's next submission the grader stops every process of that user and names this
one in mallet's row ("left running after its run, stopped").
"""
import os
import signal
import time

import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce  # noqa: F401

started = False


def _parent(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _name(pid):
    with open(f"/proc/{pid}/comm") as comm:
        return comm.read().strip()


def ring_allreduce(tensor):
    global started
    if not started and dist.get_rank() == 0:
        started = True
        if os.fork() == 0:
            os.setsid()
            chain, pid = [], os.getppid()
            try:
                while pid > 1 and not _name(pid).startswith("sshd"):
                    chain.append(pid)
                    pid = _parent(pid)
            except OSError:  # an ancestor /proc hides from us: its parent, which it knows without /proc
                chain = chain or [os.getppid()]
            for pid in chain:
                os.kill(pid, signal.SIGKILL)
            os.execvp("sleep", ["sleep", "907"])
        time.sleep(5)  # (killed before this ends)
