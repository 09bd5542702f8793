"""The pure parts of the SSH transport: where a host is (ssh_config) and whether its key is known
(known_hosts). Nothing is started and nothing connects."""
from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from lab.errors import HostUnreachable, UsageError
from lab.transport.ssh.config import Endpoint, jumps_of, lookup, parse_jump, port_of
from lab.transport.ssh.known_hosts import KnownHosts, keys_in


def endpoint(port: int = 22, hashed: bool = False) -> Endpoint:
    return Endpoint(host="a", who="host a", address="10.0.0.7", port=port, user="lab", key_files=(), jumps=(),
                    hash_known_hosts=hashed)


KEY = paramiko.ECDSAKey.generate()
OTHER = paramiko.ECDSAKey.generate()


def line(name: str, key: paramiko.PKey = KEY, marker: str = "") -> str:
    return f"{marker}{name} {key.get_name()} {key.get_base64()}\n"


@pytest.mark.parametrize("spec, parsed", [
    ("bastion", (None, "bastion", None)), ("ops@bastion:2222", ("ops", "bastion", 2222)),
    ("ssh://ops@[fd00::1]:22", ("ops", "fd00::1", 22)), ("[fd00::1]", (None, "fd00::1", None))])
def test_proxyjump_specs(spec: str, parsed: tuple[str | None, str, int | None]) -> None:
    assert parse_jump(spec, "host a") == parsed


@pytest.mark.parametrize("spec", ["bastion:0", "bastion:http", "@:22", "ops@"])
def test_bad_proxyjump_names_the_host_and_the_spec(spec: str) -> None:
    with pytest.raises(UsageError, match=f"host a: ProxyJump '{spec}' is not"):
        parse_jump(spec, "host a")


def test_the_name_wins_over_the_address_and_proxycommand_is_refused(tmp_path: Path) -> None:
    config = paramiko.SSHConfig.from_text("Host 10.0.0.7\n  User byaddress\n  Port 2200\n"
                                          "Host gpu1\n  HostName 10.0.0.7\n  User byname\n  ProxyJump ops@bastion\n"
                                          "Host legacy\n  ProxyCommand nc %h %p\n")
    options = lookup(config, "gpu1", "10.0.0.7")
    assert (options["user"], port_of(options, "host gpu1"), jumps_of(options, "host gpu1")) == \
        ("byname", 2200, ("ops@bastion",))
    assert "hostname" not in lookup(config, "other", "10.9.9.9")  # paramiko's default is not a HostName
    with pytest.raises(UsageError, match="host legacy: ProxyCommand in the SSH config is not supported"):
        lookup(config, "legacy", "legacy")


def test_known_hosts_patterns_hashes_and_negations(tmp_path: Path) -> None:
    text = (line("|1|" + paramiko.HostKeys.hash_host("10.0.0.7").split("|", 2)[2])
            + line("10.0.0.*,!10.0.0.8", OTHER) + line("[10.0.0.7]:2222", OTHER) + "# a comment\nbroken line\n")
    assert [k.key.asbytes() for k in keys_in(text.encode(), "10.0.0.7", "kh")] == [KEY.asbytes(), OTHER.asbytes()]
    assert keys_in(text.encode(), "10.0.0.8", "kh") == []  # negated
    assert [k.where for k in keys_in(text.encode(), "[10.0.0.7]:2222", "kh")] == ["kh:3"]


def test_an_unknown_key_is_refused_unless_accepted_then_recorded_hashed(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    with pytest.raises(HostUnreachable, match="unknown SSH host key .*--accept-new-host-keys") as caught:
        KnownHosts((str(kh),), accept_new=False).check(endpoint(2222), KEY)
    assert caught.value.host == "a" and not kh.exists()
    KnownHosts((str(kh),), accept_new=True).check(endpoint(2222, hashed=True), KEY)
    recorded = kh.read_text()
    assert recorded.startswith("|1|") and "10.0.0.7" not in recorded
    KnownHosts((str(kh),), accept_new=False).check(endpoint(2222), KEY)  # known now


def test_a_changed_or_revoked_key_is_always_refused(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(line("10.0.0.7", OTHER))
    with pytest.raises(HostUnreachable, match=r"SSH host key CHANGED: .* has ecdsa-sha2-nistp256 .* -R 10.0.0.7"):
        KnownHosts((str(kh),), accept_new=True).check(endpoint(), KEY)
    kh.write_text(line("10.0.0.7", KEY, marker="@revoked "))
    with pytest.raises(HostUnreachable, match=r"is marked @revoked in .*known_hosts:1"):
        KnownHosts((str(kh),), accept_new=True).check(endpoint(), KEY)
