"""compose/lab.yml describes the same lab as `python -m lab up` (no engine needed)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from lab.containerlab.containers import temp_mounts
from lab.containerlab.topology import (
    LABEL,
    NAME_LABEL,
    SHARED_DIR,
    SLOTS_LABEL,
    HostLimits,
    Topology,
    inventory_text,
)

from .conftest import REPO

COMPOSE = REPO / "compose" / "lab.yml"


def test_compose_file_matches_the_topology_lab_up_creates() -> None:
    data = yaml.safe_load(COMPOSE.read_text())
    topology = Topology()
    services = data["services"]
    assert sorted(services) == [topology.name(i) for i in topology.indices()]
    for i in topology.indices():
        service = services[topology.name(i)]
        assert service["container_name"] == topology.container(i)
        assert service["hostname"] == topology.name(i)
        endpoint = service["networks"][topology.networks()[0].name]
        assert endpoint["ipv4_address"] == topology.address(i)
        assert endpoint["aliases"] == [topology.name(i)]
        assert service["labels"] == {**topology.labels("host"), SLOTS_LABEL: "1"}  # what lab up compares
        assert service["volumes"] == ["${HOME}/.local/state/lab/labs/lab/ssh/id_ed25519.pub:"
                                      "/etc/lab/authorized_keys:ro",
                                      f"{topology.volume}:{SHARED_DIR}"]
        assert "privileged" not in service and service["cap_drop"] == ["ALL"]
        assert service["cap_add"] == list(HostLimits.CAPABILITIES)
        assert service["security_opt"] == ["no-new-privileges"]
        limits = HostLimits()
        assert service["mem_limit"] == service["memswap_limit"] == f"{limits.memory_mb}m"
        assert service["pids_limit"] == limits.pids
        assert dict(t.split(":", 1) for t in service["tmpfs"]) == temp_mounts(limits)
    network = data["networks"][topology.networks()[0].name]
    assert network["name"] == topology.networks()[0].name and network["labels"] == {LABEL: "1", NAME_LABEL: "lab"}
    assert network["ipam"]["config"] == [{"subnet": topology.subnet, "gateway": topology.gateway}]
    volume = data["volumes"][topology.volume]
    assert volume == {"name": topology.volume, "labels": {LABEL: "1", NAME_LABEL: "lab"}}


def test_the_repository_inventory_is_what_lab_up_writes() -> None:
    assert (REPO / "inventory.yaml").read_text() == inventory_text(Topology())


def compose_tools() -> list[list[str]]:
    """The compose commands this machine has: v1 (Debian's) and/or v2 (the docker plugin)."""
    found = []
    for tool in (["docker-compose"], ["docker", "compose"]):
        if shutil.which(tool[0]) and subprocess.run([*tool, "version"], capture_output=True,
                                                    timeout=30).returncode == 0:
            found.append(tool)
    return found


def test_every_compose_tool_here_accepts_the_file() -> None:
    tools = compose_tools()
    if not tools:
        if os.environ.get("CI") == "true":
            pytest.fail("CI installs docker-compose; neither it nor `docker compose` answers")
        pytest.skip("neither docker-compose nor `docker compose` is installed")
    for tool in tools:
        done = subprocess.run([*tool, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, f"{' '.join(tool)}: {done.stderr}"

