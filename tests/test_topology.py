"""Labs side by side: each lab's names, paths and subnets are its own (pure; the engine is a fake
that lists networks, as `docker network ls` would), and two labs made at once on the real engine
never share a subnet."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.containerlab import networks, state
from lab.containerlab.resources import lab_networks
from lab.containerlab.topology import LABEL, NAME_LABEL, LabPaths, Topology, default_inventory, inventory_text
from lab.errors import UsageError


def test_a_named_lab_has_names_paths_and_an_inventory_of_its_own(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    t = Topology(2, 1, "cross-vpc", "class-a")
    assert (t.container(1), t.gateway_container, t.volume) == ("class-a-node1", "class-a-gw", "class-a-shared")
    assert [n.name for n in t.networks()] == ["class-a-vpc-a", "class-a-vpc-b", "class-a-internet"]
    assert t.labels("host")[NAME_LABEL] == "class-a"
    assert default_inventory("class-a") == "class-a.inventory.yaml" and default_inventory("lab") == "inventory.yaml"
    monkeypatch.delenv(state.STATE_VAR, raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # the state is the lab name's, wherever its inventory is written; the wheelhouse is shared
    for inventory in (tmp_path / "class-a.inventory.yaml", Path("/tmp/class-a.inventory.yaml")):
        paths = LabPaths(inventory, "class-a")
        assert paths.key == tmp_path / "home" / ".local" / "state" / "lab" / "labs" / "class-a" / "ssh" / "id_ed25519"
        assert paths.state == tmp_path / "home" / ".local" / "state" / "lab"
    written = yaml.safe_load(inventory_text(t))["all"]["vars"]  # (usable by every user of the repository)
    assert written["ansible_ssh_private_key_file"] == "~/.local/state/lab/labs/class-a/ssh/id_ed25519"
    monkeypatch.setenv(state.STATE_VAR, str(tmp_path / "elsewhere"))
    written = yaml.safe_load(inventory_text(t))["all"]["vars"]
    assert written["ssh_known_hosts_file"] == str(tmp_path / "elsewhere" / "labs" / "class-a" / "known_hosts")
    assert (Topology().container(1), Topology().networks()[0].name) == ("lab-node1", "lab-net")  # as before


@pytest.mark.parametrize("name", ["Lab", "-x", "a_b", "x" * 25, ""])
def test_a_lab_name_must_make_good_container_names(name: str) -> None:
    with pytest.raises(UsageError, match="a lab's name is a lowercase letter"):
        Topology(lab=name)


@dataclass
class FakeNetwork:
    name: str
    subnet: str
    lab: str | None = None  # None: not a lab's network
    id: str = field(default="")

    @property
    def attrs(self) -> dict[str, Any]:
        labels = {LABEL: "1", NAME_LABEL: self.lab} if self.lab else {}
        return {"Labels": labels, "IPAM": {"Config": [{"Subnet": self.subnet}]}}


class FakeEngine:
    def __init__(self, *networks: FakeNetwork) -> None:
        self.all = networks
        self.networks = self

    def list(self, filters: dict[str, str] | None = None) -> list[FakeNetwork]:
        return [n for n in self.all if not filters or LABEL in n.attrs["Labels"]]


def test_subnets_are_chosen_free_on_the_engine_and_kept_once_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(networks, "host_routes", list)  # (not this machine's routes: a lab up here has some)
    engine = FakeEngine(FakeNetwork("lab-net", "10.213.0.0/24", "lab"), FakeNetwork("site", "10.213.1.0/24"),
                        FakeNetwork("big", "10.10.0.0/16"))
    second = networks.with_free_subnets(engine, Topology(lab="b"))  # type: ignore[arg-type]
    assert second.subnets == ("10.213.2.0/24",)  # past the default lab's and the site's own network
    default = networks.with_free_subnets(engine, Topology())  # type: ignore[arg-type]
    assert default.subnets == ("10.213.0.0/24",)  # its own, kept
    cross = networks.with_free_subnets(engine, Topology(kind="cross-vpc", lab="x"))  # type: ignore[arg-type]
    assert cross.subnets[1:] == ("10.20.0.0/24", "10.99.0.0/24") and cross.subnets[0] != "10.10.0.0/24"
    assert len(set(cross.subnets)) == 3
    # on an engine with no network yet, another lab than the default one keeps off the default lab's
    assert networks.with_free_subnets(FakeEngine(), Topology(lab="b")).subnets == ("10.213.1.0/24",)  # type: ignore[arg-type]
    assert networks.with_free_subnets(FakeEngine(), Topology()).subnets == ("10.213.0.0/24",)  # type: ignore[arg-type]


@pytest.mark.docker
def test_two_labs_that_choose_one_subnet_at_once_get_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two labs' networks made at once on the real engine, each having chosen its subnets before
    either made a network (held at a barrier): the engine refuses the second, which chooses again."""
    from .test_lab_docker import _client

    client = _client()
    choose, both_chose = networks.with_free_subnets, threading.Barrier(2, timeout=30)
    chosen: list[tuple[str, ...]] = []

    def choose_together(engine: Any, topology: Topology, refused: Any = ()) -> Topology:
        found = choose(engine, topology, refused)
        chosen.append(found.subnets)
        if len(chosen) <= 2:
            both_chose.wait()
        return found

    monkeypatch.setattr(networks, "with_free_subnets", choose_together)
    said: list[str] = []
    made: dict[str, Topology] = {}
    labs = [Topology(lab=f"race{n}") for n in (1, 2)]
    threads = [threading.Thread(target=lambda t=t: made.__setitem__(t.lab, networks.claim_networks(
        client, t, said.append))) for t in labs]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert chosen[0] == chosen[1]  # (the race: both chose the same free subnet)
        assert sorted(made) == ["race1", "race2"] and made["race1"].subnets != made["race2"].subnets
        assert any("choosing again" in line for line in said), said
        for lab, topology in made.items():
            net = client.networks.get(topology.networks()[0].name)
            assert networks.subnets_of(net) == list(topology.subnets), lab
    finally:
        for topology in labs:
            for net in lab_networks(client, topology.lab):
                networks.remove_network(net, said.append)


def test_a_share_host_asks_for_the_gpus_its_host_has() -> None:
    """A share's ranks open the GPUs its share host's device cgroup allows: it asks for its host's."""
    from lab.containerlab import sharehosts
    host = {"DeviceRequests": [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]],
                                "Options": {}}]}
    (asked,) = sharehosts._gpus(host)
    assert (asked["Count"], asked["Capabilities"], asked["Driver"]) == (-1, [["gpu"]], "")
    assert sharehosts._gpus({"DeviceRequests": None}) == sharehosts._gpus({}) == []
