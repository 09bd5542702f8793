"""An attacker graded beside another share on the same host. Rank 0 watches /proc/net/tcp and
/proc/net/tcp6 (which show every user's sockets, with their owner's uid) for listeners of other
users (a TCPStore, gloo's ports: they have no authentication) and tries to connect to each one
and write into it; it also tries to signal other users' processes and read their environment
(where a run's settings are), and reads every file of theirs in the temporary folders. Then it
says what it reached, by raising: "attack: reached N of M listeners of other users, touched T of
P of their processes, read F of G of their files". On a lab host the packet filter keeps shares
apart, /proc shows each user their own processes, and a file is its user's alone: N, T, P and F
are 0, while M and G say it saw the other share's run (and the other share's verdict does not
change)."""
import os
import socket
import struct
import time
from pathlib import Path

import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce  # noqa: F401  (the tutorial's: not what is tried here)

WATCH = 8.0  # seconds to watch for the other share's listeners
CONNECT = 1.5  # seconds for each connection attempt


def _listeners():
    """(address, port, family) of each listening socket of another user (not root), by /proc/net/tcp*."""
    me, found = os.getuid(), set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            (address, port), state, uid = fields[1].split(":"), fields[3], int(fields[7])
            if state == "0A" and uid not in (0, me):  # LISTEN
                found.add((_address(address, family), int(port, 16), family))
    return found


def _address(hexed, family):
    """/proc/net/tcp's address (host byte order, 32-bit words) as connect takes it; any: loopback."""
    raw = b"".join(struct.pack("<I", int(hexed[i:i + 8], 16)) for i in range(0, len(hexed), 8))
    if not any(raw):
        return "127.0.0.1" if family == socket.AF_INET else "::1"
    return socket.inet_ntop(family, raw)


def _processes():
    """(the processes of other users, not root's, in /proc; those this one could signal or whose
    environment it could read)."""
    me, seen, touched = os.getuid(), set(), set()
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or entry.stat().st_uid in (0, me):
                continue
            seen.add(entry.name)
        except OSError:
            continue
        if _may(os.kill, int(entry.name), 0) or _may((entry / "environ").read_bytes):  # (signal 0: none sent)
            touched.add(entry.name)
    return seen, touched


def _may(act, *args):
    """Whether ``act(*args)`` was allowed."""
    try:
        act(*args)
        return True
    except OSError:
        return False


def _files():
    """(files of other users in the temporary folders, how many of them this user could read)."""
    me, found, read = os.getuid(), set(), set()
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        for folder, _, names in os.walk(top):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if os.lstat(path).st_uid in (0, me):
                        continue
                    found.add(path)
                    with open(path, "rb") as f:
                        f.read(1)
                    read.add(path)
                except OSError:
                    pass
    return found, read


def _attack():
    tried, reached, deadline = set(), 0, time.monotonic() + WATCH
    processes, touched, files, read = set(), set(), set(), set()
    while time.monotonic() < deadline:
        seen, could = _processes()
        processes, touched = processes | seen, touched | could
        found, opened = _files()
        files, read = files | found, read | opened
        for address, port, family in _listeners() - tried:
            tried.add((address, port, family))
            try:
                with socket.socket(family, socket.SOCK_STREAM) as conn:
                    conn.settimeout(CONNECT)
                    conn.connect((address, port))
                    conn.sendall(b"\x00" * 65536)  # what a store or gloo makes nothing good of
                    reached += 1
            except OSError:
                pass
        time.sleep(0.1)
    raise RuntimeError(f"attack: reached {reached} of {len(tried)} listeners of other users, touched "
                       f"{len(touched)} of {len(processes)} of their processes, read {len(read)} of {len(files)} "
                       "of their files")


def ring_allreduce(tensor):
    if dist.get_rank() == 0:
        _attack()
    time.sleep(WATCH + 2)  # (the others end after rank 0 has said what it reached: it fails first)
    raise RuntimeError("eve's other ranks stop here")
