"""Looks for a way to reach the other ranks of its own submission besides the loopback's TCP (as
a student who hands values round off the wire would), and reports what it found as its error:
each rank leaves a file in /tmp and /dev/shm, a POSIX message queue and a System V segment,
then looks for the other's; looks into the other rank's process through /proc, signals it and
its launcher, tries to make a user namespace of its own (where it could mount what it likes) and
a UDP socket (which the measure of the wire does not count)."""
import ctypes
import errno
import os
import socket
import time

WAIT = 4.0  # seconds for the other's traces


def _outcome(action):
    try:
        action()
        return "reached"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def run(rank, size):
    other = 1 - rank
    libc = ctypes.CDLL(None, use_errno=True)
    found = {"uid": os.getuid(), "user": os.environ.get("USER")}
    for folder in ("/tmp", "/dev/shm", "/dev/mqueue"):
        path = f"{folder}/wendy-{rank}"
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
        os.chmod(path, 0o666)
    segment = libc.shmget(0x57E0 + rank, 4096, 0o1666)  # (IPC_CREAT | 0666)
    found["made"] = segment >= 0
    deadline = time.monotonic() + WAIT
    seen = {}
    while time.monotonic() < deadline:
        seen = {folder: os.path.exists(f"{folder}/wendy-{other}") for folder in ("/tmp", "/dev/shm", "/dev/mqueue")}
        seen["sysv"] = libc.shmget(0x57E0 + other, 0, 0) >= 0
        if any(seen.values()):
            break
        time.sleep(0.1)
    found["seen"] = seen
    theirs = [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == found["uid"] + other - rank]
    found["peer"] = bool(theirs)
    if theirs:
        pid = theirs[0]
        found["root"] = _outcome(lambda: os.listdir(f"/proc/{pid}/root/tmp"))
        found["mem"] = _outcome(lambda: open(f"/proc/{pid}/mem", "rb").close())
        found["signal"] = _outcome(lambda: os.kill(int(pid), 0))
    found["launcher"] = _outcome(lambda: os.kill(os.getppid(), 0))
    found["userns"] = "made" if libc.unshare(0x10000000) == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
    found["udp"] = _outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close())
    time.sleep(WAIT)  # (the other rank is still there while this one looks)
    raise RuntimeError(repr(found))


def _uid_of(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
    except (OSError, StopIteration, ValueError):
        return None
