"""The lab's own code as a rank's frames name it: what is never the user's program (a call's line,
a traceback, a failure's place).

That is this copy of the lab's package (the run's own, carried to every host), and, in a launch
forked from a warm server (lab.rank.warm), the server's copy too: its frames (serve, keep, become)
lie below every frame of the launch's own. The server says where it is in the zygote's environment.
"""
from __future__ import annotations

import os

SERVER_LAB_VAR = "LAB_WARM_SERVER_LAB"  # in a launch forked from a warm server: the server's copy
LAB_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # this copy's package, as its code names it


def _lab_dirs() -> tuple[str, ...]:
    server = os.environ.get(SERVER_LAB_VAR, "")
    return (LAB_DIR, server) if os.path.isabs(server) and server.endswith(os.sep) and server != LAB_DIR else (LAB_DIR,)


# The folders of the lab's own code: this copy's, and (in a launch forked from a warm server) the
# server's (a zygote imports this module afresh, once the server has said where its copy is)
LAB_DIRS = _lab_dirs()
