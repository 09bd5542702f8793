"""Subnets the lab takes for its own networks (a container lab's, an overlay's): /24s that overlap
nothing already there, the wanted one first. Pure."""
from __future__ import annotations

import ipaddress
import itertools
import json
from collections.abc import Iterator, Sequence

from lab.errors import LabError

Subnet = ipaddress.IPv4Network | ipaddress.IPv6Network


def free_subnets(defaults: Sequence[str], taken: Sequence[Subnet]) -> tuple[str, ...]:
    """A /24 for each of ``defaults``: itself where nothing in ``taken`` (nor one chosen before)
    overlaps it, else the next free one of the pool."""
    chosen: list[Subnet] = []
    for default in defaults:
        free = (n for n in map(ipaddress.ip_network, itertools.chain([default], _pool()))
                if not any(n.overlaps(other) for other in (*taken, *chosen)))
        found = next(free, None)
        if found is None:
            raise LabError("no free /24 is left in 10.0.0.0/8 for the lab's networks")
        chosen.append(found)
    return tuple(str(n) for n in chosen)


def _pool() -> Iterator[str]:
    """The /24s a lab takes when its defaults are taken: 10.213.0.0/16 first, then the rest of 10/8."""
    for second in (213, *range(214, 256), *range(1, 213)):
        for third in range(256):
            yield f"10.{second}.{third}.0/24"


def routes_in(output: bytes | str, but_dev: str = "") -> list[Subnet]:
    """The destinations in ``ip -j route``'s output (but those through the interface ``but_dev``)."""
    try:
        routes = [r.get("dst", "") for r in json.loads(output) if not but_dev or r.get("dev") != but_dev]
    except (ValueError, AttributeError):
        return []
    found = []
    for dst in routes:
        try:
            found.append(ipaddress.ip_network(dst, strict=False))
        except ValueError:  # "default"
            continue
    return found
