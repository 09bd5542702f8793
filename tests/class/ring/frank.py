"""Correct, but leaves daemons behind: a new session and a double fork."""
import os
import subprocess
import time

from lab.suite.exercises.ring_allreduce import allreduce
from lab.suite.exercises.ring_allreduce import ring_allreduce as reference_ring

started = False


def ring_allreduce(tensor):
    global started
    if not started:
        started = True
        subprocess.Popen(["sleep", "900"], start_new_session=True)
        if os.fork() == 0:  # the classic daemon: fork, setsid, fork again, parent exits
            os.setsid()
            if os.fork() == 0:
                time.sleep(900)
            os._exit(0)
    reference_ring(tensor)


__all__ = ["allreduce", "ring_allreduce"]
