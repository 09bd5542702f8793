"""The pure parts of ``lab net shape``: the options read, and the shaper's netlink messages (the
shaping itself is tested on the container lab: tests/test_lab_docker.py)."""
from __future__ import annotations

import struct

import pytest

from lab.containerlab.shaping import Shape, host_indices, parse_shape
from lab.containerlab.topology import Topology
from lab.errors import UsageError
from lab.rank import netem


def test_options_read_with_their_units() -> None:
    shape = parse_shape("20ms", "500us", "0.1%", "1.5gbit")
    assert shape == Shape(delay=0.02, jitter=0.0005, loss=0.001, rate_bit=1_500_000_000)
    assert str(shape) == "delay 20ms +-500us, loss 0.1%, rate 1.5gbit"
    assert str(parse_shape(None, None, None, "100kbit")) == "rate 100kbit"


@pytest.mark.parametrize("delay, loss, rate, message", [
    ("20", None, None, "--delay: '20' is not a time"),
    ("8s", None, None, "--delay and --jitter add up to more than 2s"),
    (None, "101%", None, "--loss: '101%' is not a percentage from 0% to 100%"),
    (None, "0.1", None, "--loss: '0.1' is not a percentage"),
    (None, None, "1gbps", "--rate: '1gbps' is not a rate"),
    (None, None, "100bit", "--rate: 100bit is below 8kbit"),
    (None, None, None, "nothing to shape"),
])
def test_bad_options_are_named(delay: str | None, loss: str | None, rate: str | None, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("+", r"\+")):
        parse_shape(delay, "2s" if delay == "8s" else None, loss, rate)


def test_hosts_are_named_or_all() -> None:
    topology = Topology(hosts=3)
    assert host_indices(topology, []) == host_indices(topology, ["all"]) == [1, 2, 3]
    assert host_indices(topology, ["node3", "node1", "node3"]) == [1, 3]
    with pytest.raises(UsageError, match="lab lab has no host node4, nodeX: its hosts are node1, node2, node3"):
        host_indices(topology, ["node4", "nodeX"])


def _packet_message(packet_id: int, before: bytes = b"") -> bytes:
    header = netem.attribute(netem.NFQA_PACKET_HDR, struct.pack(">IHB", packet_id, 0x0800, 1))
    body = struct.pack("=BBH", 2, 0, 0) + before + header
    return struct.pack("=IHHII", 16 + len(body), netem.NFNL_SUBSYS_QUEUE << 8 | netem.NFQNL_MSG_PACKET, 0, 0, 0) + body


def test_the_shaper_reads_every_packet_id_in_one_read() -> None:
    other = netem.attribute(9, b"\x01\x02\x03")  # an attribute before the header, padded
    data = _packet_message(7) + _packet_message(1 << 31, other) + b"\x00" * 8  # (a truncated tail is ignored)
    assert list(netem.packet_ids(data)) == [7, 1 << 31]


def test_a_verdict_names_the_packet_and_the_queue() -> None:
    message = netem.verdict(42, accept=False)
    length, kind = struct.unpack_from("=IH", message)
    assert length == len(message) and kind == netem.NFNL_SUBSYS_QUEUE << 8 | netem.NFQNL_MSG_VERDICT
    assert struct.unpack_from(">H", message, 18)[0] == netem.QUEUE
    assert struct.unpack_from(">II", message, 24) == (netem.NF_DROP, 42)
