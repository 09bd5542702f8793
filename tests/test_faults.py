"""The pure parts of ``lab break`` and ``lab fix`` (the faults themselves are made and named for real
on the container lab: tests/test_lab_docker.py), and the error strings a report explains."""
from __future__ import annotations

import pytest

from lab.containerlab.faults import FAULTS, KINDS
from lab.doctor.known import KNOWN

from .conftest import REPO


def test_every_fault_undoes_what_it_does_and_is_in_the_docs_table() -> None:
    doc = (REPO / "docs" / "engineers.md").read_text()
    for fault in FAULTS.values():
        for done, undone in (fault.in_host, fault.in_namespace):
            assert bool(undone) >= bool(done), fault.kind
        assert fault.in_host[1] or fault.in_namespace[1], fault.kind
        assert f"| `{fault.kind}` |" in doc, fault.kind
    assert KINDS == ("loopback-hostname", "blocked-port", "wrong-ifname", "partition", "slow-dns", "mtu", "port-taken")


@pytest.mark.parametrize("line, kind", [
    ("[E socket.cpp] connect [127.0.1.1]:46512: Connection refused", "loopback-hostname"),
    ("RuntimeError: Unable to find address for: eth9", "wrong-ifname"),
    ("The server socket has failed to listen on any local network address. port: 29500, useIpv6: false, "
     "code: -98, name: EADDRINUSE, message: address already in use", "port-taken"),
    ("OSError: [Errno 97] Address family not supported by protocol", "address-family"),
    ("connect [10.213.0.12]:40000: Connection refused", "refused"),
    ("socket.gaierror: [Errno -2] Name or service not known", "resolve"),
])
def test_the_well_known_error_strings_map_to_their_cause(line: str, kind: str) -> None:
    assert next(k.kind for k in KNOWN if k.pattern.search(line)) == kind
