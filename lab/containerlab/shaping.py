"""``lab net shape / show / clear``: delay, jitter, loss and a rate on a lab's links.

Each shaped host gets a shaper: a container with NET_ADMIN in the host's network namespace that
runs :mod:`lab.rank.netem` (the host itself stays unprivileged). The shaper is the
record of the shape (its labels say what it set), ``lab net clear`` stops it (it takes what it set
away) and ``lab down`` removes it with the lab.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import docker
from docker.errors import APIError, NotFound

from lab.containerlab import helper
from lab.containerlab.engine import EngineError, Say, each, reason
from lab.containerlab.topology import SHAPE_LABEL, SHAPED_LABEL, Topology
from lab.errors import UsageError
from lab.rank import netem

ROLE_NAME = "shaper"
READY_WAIT = 20.0  # seconds for a shaper to say it is ready
STOP_WAIT = 10  # seconds for a shaper to take its settings away
_TIME = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s)")
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", re.I)
_LOSS = re.compile(r"(\d+(?:\.\d+)?)%")
DELAY_MAX = 2.0  # seconds: beyond, TCP gives up on connecting in time


@dataclass(frozen=True)
class Shape:
    """What one host's links do: ``delay`` and ``jitter`` (seconds) and ``loss`` (a fraction) on
    what it receives, ``rate_bit`` (bits per second, 0: unlimited) on what it sends."""

    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0
    rate_bit: int = 0

    def __str__(self) -> str:
        parts = []
        if self.delay or self.jitter:
            parts.append(f"delay {_seconds(self.delay)}" + (f" +-{_seconds(self.jitter)}" if self.jitter else ""))
        if self.loss:
            parts.append(f"loss {self.loss * 100:g}%")
        if self.rate_bit:
            parts.append(f"rate {_rate(self.rate_bit)}")
        return ", ".join(parts) or "none"


def parse_shape(delay: str | None, jitter: str | None, loss: str | None, rate: str | None) -> Shape:
    """``--delay 20ms --jitter 2ms --loss 0.1% --rate 1gbit``, checked, as a Shape."""
    if not any((delay, jitter, loss, rate)):
        raise UsageError("nothing to shape: give --delay, --jitter, --loss or --rate "
                         "(lab net clear takes a shape away)")
    shape = Shape(_time("--delay", delay), _time("--jitter", jitter), _loss(loss), _rate_bits(rate))
    if shape.delay + shape.jitter > DELAY_MAX:
        raise UsageError(f"--delay and --jitter add up to more than {DELAY_MAX:g}s: that is a partition, not a link")
    return shape


def _time(option: str, text: str | None) -> float:
    if text is None:
        return 0.0
    found = _TIME.fullmatch(text.strip())
    if found is None:
        raise UsageError(f"{option}: {text!r} is not a time (a number with us, ms or s: 20ms)")
    return float(found[1]) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[found[2]]


def _loss(text: str | None) -> float:
    if text is None:
        return 0.0
    found = _LOSS.fullmatch(text.strip())
    if found is None or float(found[1]) > 100:
        raise UsageError(f"--loss: {text!r} is not a percentage from 0% to 100% (0.1%)")
    return float(found[1]) / 100


def _rate_bits(text: str | None) -> int:
    if text is None:
        return 0
    found = _RATE.fullmatch(text.strip())
    if found is None:
        raise UsageError(f"--rate: {text!r} is not a rate (a number with bit, kbit, mbit or gbit: 1gbit)")
    bits = round(float(found[1]) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[found[2].lower()])
    if bits < 8000:
        raise UsageError(f"--rate: {text} is below 8kbit, too slow for a TCP connection to be set up in time")
    return bits


def _seconds(value: float) -> str:
    return f"{value * 1e3:g}ms" if value >= 1e-3 else f"{value * 1e6:g}us"


def _rate(bits: int) -> str:
    for unit, size in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= size:
            return f"{bits / size:g}{unit}"
    return f"{bits}bit"


def host_indices(topology: Topology, names: Sequence[str]) -> list[int]:
    """``node1 node3`` (or ``all``, or nothing: every host) as the lab's host numbers."""
    if not names or list(names) == ["all"]:
        return list(topology.indices())
    by_name = {topology.name(i): i for i in topology.indices()}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise UsageError(f"lab {topology.lab} has no host {', '.join(unknown)}: its hosts are "
                         f"{', '.join(by_name)} (or all)")
    return sorted({by_name[name] for name in names})


def shape(client: docker.DockerClient, topology: Topology, indices: Sequence[int], wanted: Shape, say: Say) -> None:
    """Give each of the hosts ``indices`` the shape ``wanted`` (in place of any shape they had)."""
    def one(i: int) -> None:
        _stop(client, topology, i)
        host = helper.running_host(client, topology, i)
        labels = {**topology.labels(ROLE_NAME), SHAPED_LABEL: host.name, SHAPE_LABEL: json.dumps(asdict(wanted))}
        try:
            shaper = client.containers.run(
                host.image.id, ["python3", "-c", _PROGRAM, json.dumps(asdict(wanted))], entrypoint=[],
                name=topology.shaper(i), network_mode=f"container:{host.id}", cap_drop=["ALL"],
                cap_add=["NET_ADMIN"], init=True, detach=True, labels=labels)
        except APIError as exc:
            raise EngineError(f"host {topology.name(i)}: cannot start its shaper: "
                              f"{reason(exc)}") from None
        _wait_ready(shaper, topology.name(i))
        say(f"{topology.name(i)}: {wanted}")

    each(one, indices)


def clear(client: docker.DockerClient, topology: Topology, indices: Sequence[int], say: Say) -> None:
    """Take the shape of each of the hosts ``indices`` away (those without one are left as they are)."""
    def one(i: int) -> None:
        if _stop(client, topology, i):
            say(f"{topology.name(i)}: shape cleared")

    each(one, indices)


def shapes(client: docker.DockerClient, topology: Topology) -> dict[str, Shape | None]:
    """Each host's shape now, by host name (None: unshaped)."""
    found: dict[str, Shape | None] = {topology.name(i): None for i in topology.indices()}
    for i in topology.indices():
        try:
            shaper = client.containers.get(topology.shaper(i))
        except NotFound:
            continue
        if shaper.status == "running":
            found[topology.name(i)] = Shape(**json.loads(shaper.labels[SHAPE_LABEL]))
    return found


def _stop(client: docker.DockerClient, topology: Topology, i: int) -> bool:
    """Stop host i's shaper, which takes its settings away as it goes; whether there was one."""
    try:
        shaper = client.containers.get(topology.shaper(i))
    except NotFound:
        return False
    if shaper.status == "running":
        shaper.stop(timeout=STOP_WAIT)
        if shaper.wait(timeout=STOP_WAIT + 5).get("StatusCode") not in (0, 143):
            raise EngineError(f"host {topology.name(i)}: its shaper could not take its settings away: "
                              f"{_last_line(shaper)}")
    shaper.remove(force=True)
    return True


def _wait_ready(shaper: docker.models.containers.Container, host: str) -> None:
    deadline = time.monotonic() + READY_WAIT
    while time.monotonic() < deadline:
        shaper.reload()
        if b"ready" in shaper.logs():
            return
        if shaper.status not in ("created", "running"):
            break
        time.sleep(0.1)
    why = _last_line(shaper) or f"not ready within {READY_WAIT:g}s"
    shaper.remove(force=True)
    raise EngineError(f"host {host}: cannot shape its links: {why}")


def _last_line(shaper: docker.models.containers.Container) -> str:
    lines = bytes(shaper.logs()).decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


_PROGRAM = Path(netem.__file__).read_text()  # (run by python3 -c: the helper has no copy of the lab)
