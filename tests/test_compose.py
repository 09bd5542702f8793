"""compose/lab.yml describes the same lab as `python -m lab up` (no engine needed)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from lab import cluster

from .conftest import REPO

COMPOSE = REPO / "compose" / "lab.yml"


def test_compose_file_matches_the_topology_lab_up_creates() -> None:
    data = yaml.safe_load(COMPOSE.read_text())
    topology = cluster.Topology()
    services = data["services"]
    assert sorted(services) == [topology.name(i) for i in topology.indices()]
    for i in topology.indices():
        service = services[topology.name(i)]
        assert service["container_name"] == topology.container(i)
        assert service["hostname"] == topology.name(i)
        endpoint = service["networks"][cluster.NETWORK]
        assert endpoint["ipv4_address"] == topology.address(i)
        assert endpoint["aliases"] == [topology.name(i)]
        assert service["labels"] == {cluster.LABEL: "1", cluster.ROLE: "host"}
        assert service["volumes"] == ["../.lab/ssh/id_ed25519.pub:/etc/lab/authorized_keys:ro",
                                      f"{cluster.SHARED_VOLUME}:{cluster.SHARED_DIR}"]
        assert "privileged" not in service and "cap_add" not in service
    network = data["networks"][cluster.NETWORK]
    assert network["name"] == cluster.NETWORK and network["labels"] == {cluster.LABEL: "1"}
    assert network["ipam"]["config"] == [{"subnet": topology.subnet, "gateway": topology.gateway}]
    volume = data["volumes"][cluster.SHARED_VOLUME]
    assert volume == {"name": cluster.SHARED_VOLUME, "labels": {cluster.LABEL: "1"}}


def test_the_repository_inventory_is_what_lab_up_writes() -> None:
    assert (REPO / "inventory.yaml").read_text() == cluster.inventory_text(cluster.Topology())


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
