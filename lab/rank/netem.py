"""The shaper of one lab host's links, run inside the host's network namespace (``lab net shape``).

A helper container with NET_ADMIN joins the host's namespace and runs this file (standard
library only: ``python3 -c``) with the shape as JSON; the host itself stays unprivileged.

- rate: a token bucket (``tc qdisc ... tbf``) on each of the host's interfaces: what it sends.
- delay, jitter, loss: every packet the host exchanges with another goes, once, through an
  NFQUEUE (``iptables ... -j NFQUEUE --queue-bypass``) to this program, which gives it its verdict
  after the delay (plus a uniform jitter of +-jitter), or drops it with the loss's probability:
  TCP as it arrives, anything else as it leaves. tc's netem would do this in the kernel, but
  kernels without sch_netem exist (this project's CI runs on one) while NFQUEUE and tbf are
  everywhere. TCP is held on arrival because a sender's TCP throttles itself while its own
  packets wait in its host (TCP small queues); the rest on departure because ping times a reply
  from its arrival in the kernel, before any hold there. Either way a round trip grows by the
  delay of each shaped end, as with netem on both.

Everything it sets is taken away again when it stops (SIGTERM, from ``lab net clear`` or
``lab down``), and by ``clear`` at its start. Should it die unannounced, ``--queue-bypass`` lets
packets through unshaped rather than drop them.
"""
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

QUEUE = 7213  # one queue per network namespace: the host's own
CHAINS = {"INPUT": ("LAB-SHAPE-IN", "-i", "-p"), "OUTPUT": ("LAB-SHAPE-OUT", "-o", "!", "-p")}  # TCP in, the rest out
QUEUE_MAXLEN = 20000  # packets held at once; more are dropped, as netem's limit does
NETLINK_NETFILTER = 12
SO_RCVBUFFORCE = 33
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4  # whole GSO packets: nothing here reads the payload
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_DROP, NF_ACCEPT = 0, 1


def attribute(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def message(kind: int, flags: int, attributes: list[bytes], seq: int = 0) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(QUEUE)) + b"".join(attributes)
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def verdict(packet_id: int, accept: bool) -> bytes:
    return message(NFQNL_MSG_VERDICT, NLM_F_REQUEST,
                   [attribute(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT if accept else NF_DROP, packet_id))])


def packet_ids(data: bytes) -> Iterator[int]:
    """The ids of the queued packets in one read from the netlink socket."""
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            return
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            at, end = offset + 20, offset + length
            while at + 4 <= end:
                size, which = struct.unpack_from("=HH", data, at)
                if size < 4:
                    break
                if which & 0x7FFF == NFQA_PACKET_HDR:
                    yield struct.unpack_from(">I", data, at + 4)[0]
                    break
                at += (size + 3) & ~3
        offset += (length + 3) & ~3


def bind_queue() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    sock.bind((0, 0))
    settings = ([attribute(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, 0))],
                [attribute(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META)),
                 attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", QUEUE_MAXLEN)),
                 attribute(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_GSO)),
                 attribute(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_GSO))])
    for seq, attributes in enumerate(settings, 1):
        sock.send(message(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, attributes, seq))
        sock.settimeout(5)
        reply = sock.recv(65536)
        if struct.unpack_from("=H", reply, 4)[0] == NLMSG_ERROR and struct.unpack_from("=i", reply, 16)[0]:
            raise OSError(-struct.unpack_from("=i", reply, 16)[0], "NFQUEUE")
    sock.settimeout(None)
    return sock


def serve(sock: socket.socket, delay: float, jitter: float, loss: float) -> None:
    """Each packet's verdict, when its time comes (forever)."""
    due: list[tuple[float, int, bool]] = []  # (when, packet id, accept)
    while True:
        ready, _, _ = select.select([sock], [], [], max(0.0, due[0][0] - time.monotonic()) if due else None)
        now = time.monotonic()
        if ready:
            for packet_id in packet_ids(sock.recv(1 << 20)):
                accept = not (loss and random.random() < loss)
                heapq.heappush(due, (now + max(0.0, delay + random.uniform(-jitter, jitter)), packet_id, accept))
        while due and due[0][0] <= now:
            _, packet_id, accept = heapq.heappop(due)
            sock.send(verdict(packet_id, accept))


def interfaces() -> list[str]:
    return sorted(name for name in os.listdir("/sys/class/net") if name != "lo")


def sh(*argv: str, check: bool = True) -> bool:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")
    return done.returncode == 0


def clear() -> None:
    for name in interfaces():
        sh("tc", "qdisc", "del", "dev", name, "root", check=False)
    for hook, (chain, *_) in CHAINS.items():
        while sh("iptables", "-D", hook, "-j", chain, check=False):
            pass
        sh("iptables", "-F", chain, check=False)
        sh("iptables", "-X", chain, check=False)


def apply(shape: dict[str, Any]) -> socket.socket | None:
    rate = shape.get("rate_bit")
    if rate:
        burst = max(64 * 1024, rate // 8 // 250)  # bytes: a GSO packet, or 4 ms at the rate
        for name in interfaces():
            sh("tc", "qdisc", "replace", "dev", name, "root", "tbf", "rate", f"{rate}bit", "burst", str(burst),
               "latency", "100ms")
    if not (shape.get("delay") or shape.get("jitter") or shape.get("loss")):
        return None
    sock = bind_queue()
    for hook, (chain, direction, *protocol) in CHAINS.items():
        sh("iptables", "-N", chain)
        sh("iptables", "-A", chain, "!", direction, "lo", *protocol, "tcp", "-j", "NFQUEUE", "--queue-num", str(QUEUE),
           "--queue-bypass")
        sh("iptables", "-I", hook, "-j", chain)
    return sock


def main() -> None:
    shape = json.loads(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    clear()
    try:
        sock = apply(shape)
        print("ready", flush=True)
        if sock is None:
            while True:
                signal.pause()
        serve(sock, shape.get("delay", 0.0), shape.get("jitter", 0.0), shape.get("loss", 0.0))
    except (OSError, RuntimeError) as err:
        print(f"cannot shape: {err}", flush=True)
        sys.exit(1)
    finally:
        clear()


if __name__ == "__main__":
    main()
