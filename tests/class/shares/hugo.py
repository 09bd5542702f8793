"""An attacker graded beside another share on the same host, after its ports: rank 0 binds every
port of the host's ephemeral range that it can (its file limit raised to the most it may), says
how many in a file of the temporary folders (so the test's other share knows the hoard is
there), holds them for a while, lets them go and fails, saying how many it held. Where the shares
of a host share its port space, the other share's gloo can then neither listen (it binds port 0)
nor connect (no local port is left); through the lab's share hosts each share has a network of
its own, and the other share's run does not notice."""
import os
import resource
import socket
import time

import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce  # noqa: F401  (the tutorial's: not what is tried here)

HOLD = 8.0  # seconds the ports are held (the other share meets the hoard in a second or two)
MARK = "/tmp/hugo-holds-the-ports"
PER_PROCESS = 15000  # ports one process binds (its file limit, raised, is the engine's: 20000 here)


def _bind(ports):
    """Sockets bound to as many of ``ports`` as this process can."""
    held = []
    for port in ports:
        try:
            s = socket.socket()
        except OSError:  # (no file left)
            break
        try:
            s.bind(("0.0.0.0", port))
            held.append(s)
        except OSError:
            s.close()
    return held


def _hoard():
    """Every port of the ephemeral range bound, PER_PROCESS a process (children hold theirs for HOLD
    seconds, then exit): (the sockets this process holds, how many all hold, the range's size)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    parts = [range(first, min(first + PER_PROCESS, high + 1)) for first in range(low, high + 1, PER_PROCESS)]
    counts = []
    for part in parts[1:]:
        read, write = os.pipe()
        if os.fork() == 0:
            os.close(read)
            os.write(write, f"{len(_bind(part))}\n".encode())
            time.sleep(HOLD)
            os._exit(0)
        os.close(write)
        counts.append(read)
    held = _bind(parts[0])
    return held, len(held) + sum(int(os.read(r, 32) or b"0") for r in counts), high - low + 1


def ring_allreduce(tensor):
    if dist.get_rank() == 0:
        held, total, wanted = _hoard()
        with open(MARK, "w") as f:
            f.write(f"{total}\n")
        os.chmod(MARK, 0o644)
        time.sleep(HOLD)
        for s in held:
            s.close()
        raise RuntimeError(f"hoard: held {total} of {wanted} ephemeral ports for {HOLD:g}s")
    time.sleep(HOLD + 2)  # (the others end after rank 0 has said what it held: it fails first)
    raise RuntimeError("hugo's other ranks stop here")
