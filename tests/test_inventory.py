"""lab.inventory.hosts: valid Ansible-style inventories, and every error with its exact line."""
from __future__ import annotations

import logging
import os
import textwrap
import time
from pathlib import Path

import pytest

from lab.errors import ExitCode, InventoryError, UsageError
from lab.inventory.hosts import load_inventory, local_inventory, parse_inventory
from lab.inventory.model import Host, Inventory

REPO_INVENTORY = Path(__file__).resolve().parent.parent / "inventory.yaml"
HOSTILE = Path(__file__).resolve().parent / "hostile"


def parse(text: str, base_dir: str | os.PathLike[str] = "/nonexistent") -> Inventory:
    return parse_inventory(textwrap.dedent(text), "inv.yaml", os.fspath(base_dir))


def private_key(path: Path) -> Path:
    """A stand-in private key, 0600 as ssh wants it (the lab refuses one others can read)."""
    path.write_text("key\n")
    path.chmod(0o600)
    return path


def hosts(inventory: Inventory) -> dict[str, Host]:
    return {host.name: host for host in inventory.hosts}


def parse_error(text: str, base_dir: str | os.PathLike[str] = "/nonexistent") -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        parse(text, base_dir)
    return caught.value


def assert_error(err: InventoryError, line: int | None, fragment: str, source: str = "inv.yaml") -> None:
    message = str(err)
    where = f"{source}:{line}: " if line is not None else f"{source}: "
    assert message.startswith(where), message
    assert "\n" not in message
    assert fragment in message
    assert (err.source, err.line) == (source, line)
    assert err.exit_code == ExitCode.BAD_INPUT


# -- valid inventories -----------------------------------------------------------------


def test_example_inventory(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    key = private_key(tmp_path / "keys" / "id_ed25519")
    inventory = parse("""\
        all:
          vars:
            ansible_user: lab
          hosts:
            h1:
              ansible_host: 172.28.0.11
              ansible_port: 2222
              ansible_user: root
              ansible_ssh_private_key_file: keys/id_ed25519
          children:
            gpu:
              vars: {gpus: 1}
              hosts:
                h2: {ansible_host: 10.0.0.2, slots: 2, data_address: 192.168.1.2,
                     network_interface: eth1}
                h3:
        """, tmp_path)
    assert inventory.path == "inv.yaml"
    assert [host.name for host in inventory.hosts] == ["h1", "h2", "h3"]
    assert inventory.world_size == 4
    h1, h2, h3 = inventory.hosts
    assert h1 == Host("h1", "172.28.0.11", port=2222, user="root", key_file=str(key), source="inv.yaml:5")
    assert h2 == Host("h2", "10.0.0.2", user="lab", slots=2, gpus=1, data_address="192.168.1.2",
                      network_interface="eth1", groups=("gpu",), source="inv.yaml:14")
    assert h3 == Host("h3", "h3", user="lab", gpus=1, groups=("gpu",), source="inv.yaml:16")
    assert not any(host.is_local for host in inventory.hosts)


def test_defaults() -> None:
    (host,) = parse("""\
        all:
          hosts:
            h1:
        """).hosts
    assert host == Host("h1", "h1", source="inv.yaml:3")
    assert (host.port, host.user, host.key_file, host.connection, host.python) == (
        22, None, None, "ssh", "python3")
    assert (host.slots, host.gpus, host.data_address, host.network_interface, host.container) == (
        1, 0, None, None, None)


def test_vars_inherit_all_then_parent_then_child_then_host() -> None:
    inventory = parse("""\
        all:
          vars: {ansible_user: base, ansible_port: 2200, slots: 2, gpus: 1}
          children:
            rack:
              vars: {ansible_user: rack, slots: 3, gpus: 2}
              children:
                gpu:
                  vars: {ansible_user: gpu, slots: 4}
                  hosts:
                    h1: {ansible_user: own}
                    h2:
        """)
    h1, h2 = inventory.hosts
    assert (h1.user, h1.slots, h1.gpus, h1.port) == ("own", 4, 2, 2200)
    assert (h2.user, h2.slots, h2.gpus, h2.port) == ("gpu", 4, 2, 2200)
    assert h1.groups == h2.groups == ("rack", "gpu")


def test_child_vars_win_by_depth_not_by_position_in_the_file() -> None:
    # gpu is defined first but listed (bare) under rack, so it is deeper and wins over rack,
    # although 'rack' sorts after 'gpu'.
    (host,) = parse("""\
        all:
          children:
            gpu:
              vars: {slots: 4}
              hosts:
                h1:
            rack:
              vars: {slots: 2, gpus: 1}
              children:
                gpu:
        """).hosts
    assert (host.slots, host.gpus, host.groups) == (4, 1, ("gpu", "rack"))


def test_groups_at_the_same_depth_apply_in_name_order() -> None:
    (host,) = parse("""\
        all:
          children:
            b:
              vars: {slots: 3}
              hosts: {h1: }
            a:
              vars: {slots: 2, gpus: 1}
              hosts: {h1: }
        """).hosts
    assert (host.slots, host.gpus, host.groups) == (3, 1, ("b", "a"))


def test_bare_reference_adds_a_group_and_keeps_the_definition() -> None:
    inventory = parse("""\
        all:
          hosts:
            h2:
          children:
            gpu:
              hosts:
                h1: {slots: 2}
                h2: {slots: 3}
            big:
              hosts:
                h1:
                h2: {}
        """)
    assert [host.name for host in inventory.hosts] == ["h2", "h1"]  # order of first appearance
    h2, h1 = inventory.hosts
    assert (h1.slots, h1.groups, h1.source) == (2, ("gpu", "big"), "inv.yaml:7")
    assert (h2.slots, h2.groups, h2.source) == (3, ("gpu", "big"), "inv.yaml:8")


def test_top_level_groups_are_children_of_all() -> None:
    inventory = parse("""\
        all:
          vars: {ansible_user: lab}
        gpu:
          vars: {gpus: 1}
          hosts:
            h1:
        cpu:
          hosts:
            h2:
        """)
    assert [(h.name, h.user, h.gpus, h.groups) for h in inventory.hosts] == [
        ("h1", "lab", 1, ("gpu",)), ("h2", "lab", 0, ("cpu",))]


def test_all_is_optional() -> None:
    (host,) = parse("""\
        web:
          hosts:
            h1:
        """).hosts
    assert host.groups == ("web",)


def test_key_file_is_resolved_against_the_inventory_directory(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    private_key(tmp_path / "id_rel")
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    private_key(tmp_path / "home" / ".ssh" / "id_home")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir("/")
    inventory = parse(f"""\
        all:
          hosts:
            relative: {{ansible_ssh_private_key_file: ./id_rel}}
            home: {{ansible_ssh_private_key_file: ~/.ssh/id_home}}
            absolute: {{ansible_ssh_private_key_file: {tmp_path / "id_rel"}}}
        """, tmp_path)
    assert [host.key_file for host in inventory.hosts] == [
        str(tmp_path / "id_rel"), str(tmp_path / "home" / ".ssh" / "id_home"), str(tmp_path / "id_rel")]


def test_key_file_in_group_vars_applies_to_its_hosts(tmp_path: Path) -> None:
    private_key(tmp_path / "id")
    inventory = parse("""\
        all:
          vars: {ansible_ssh_private_key_file: id}
          hosts: {h1: , h2: }
        """, tmp_path)
    assert {host.key_file for host in inventory.hosts} == {str(tmp_path / "id")}


def test_known_hosts_file_is_resolved_like_the_key_file_and_may_not_exist_yet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "known_hosts").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir("/")
    inventory = parse(f"""\
        all:
          vars: {{ssh_known_hosts_file: ./known_hosts}}
          hosts:
            relative:
            home: {{ssh_known_hosts_file: ~/.ssh/lab_known_hosts}}
            absolute: {{ssh_known_hosts_file: {tmp_path / "new_known_hosts"}}}
        """, tmp_path)
    assert [host.known_hosts for host in inventory.hosts] == [
        str(tmp_path / "known_hosts"), str(tmp_path / "home" / ".ssh" / "lab_known_hosts"),
        str(tmp_path / "new_known_hosts")]
    assert parse("all:\n  hosts: {h1: }\n").hosts[0].known_hosts is None


def test_connections() -> None:
    inventory = hosts(parse("""\
        all:
          vars: {docker_container: shared}
          hosts:
            here: {ansible_connection: local, ansible_host: 127.0.0.1}
            box: {ansible_connection: docker}
            named: {ansible_connection: docker, docker_container: lab-node-2}
            remote: {ansible_connection: ssh}
        """))
    assert inventory["here"].is_local and inventory["here"].address == "127.0.0.1"
    assert (inventory["box"].connection, inventory["box"].container) == ("docker", "shared")
    assert inventory["named"].container == "lab-node-2"
    assert (inventory["remote"].connection, inventory["remote"].container) == ("ssh", None)
    assert not inventory["box"].is_local


def test_docker_container_defaults_to_the_host_name() -> None:
    (host,) = parse("""\
        all:
          hosts:
            node1: {ansible_connection: docker}
        """).hosts
    assert host.container == "node1"


def test_python_interpreter() -> None:
    inventory = hosts(parse("""\
        all:
          hosts:
            h1: {ansible_python_interpreter: /opt/venv/bin/python}
            h2: {ansible_python_interpreter: auto_silent}
        """))
    assert (inventory["h1"].python, inventory["h2"].python) == ("/opt/venv/bin/python", "python3")


def test_common_ansible_keys_are_tolerated() -> None:
    (host,) = parse("""\
        all:
          vars:
            ansible_become: true
            ansible_ssh_common_args: -o StrictHostKeyChecking=no
          hosts:
            h1: {ansible_ssh_extra_args: [-v]}
        """).hosts
    assert host == Host("h1", "h1", become=True, source="inv.yaml:6")  # (become: lab net overlay --hosts)


def test_numbers_as_names_and_strings() -> None:
    (host,) = parse("""\
        all:
          hosts:
            10.0.0.5: {ansible_user: 1000, ansible_port: 0x16}
        """).hosts
    assert (host.name, host.address, host.user, host.port) == ("10.0.0.5", "10.0.0.5", "1000", 22)


def test_anchors_aliases_and_merge_keys() -> None:
    inventory = hosts(parse("""\
        all:
          hosts:
            h1: &gpu_host {slots: 2, gpus: 1}
            h2: *gpu_host
            h3:
              <<: *gpu_host
              slots: 4
            h4:
              <<: [{slots: 5}, *gpu_host]
        """))
    assert [(h.slots, h.gpus) for h in inventory.values()] == [(2, 1), (2, 1), (4, 1), (5, 1)]
    assert inventory["h2"].source == "inv.yaml:4"


def test_a_group_repeated_through_an_alias_is_listed_not_redefined() -> None:
    (host,) = parse("""\
        all:
          children:
            a: &a
              hosts: {h1: }
            b:
              children:
                a: *a
        """).hosts
    assert host.groups == ("a", "b")


def test_local_inventory() -> None:
    inventory = local_inventory(4)
    (host,) = inventory.hosts
    assert (host.name, host.address, host.connection, host.slots) == ("local", "127.0.0.1", "local", 4)
    assert host.is_local and inventory.world_size == 4


def test_local_inventory_needs_a_process() -> None:
    with pytest.raises(UsageError, match="got 0"):
        local_inventory(0)


def test_hosts_are_frozen() -> None:
    (host,) = local_inventory(1).hosts
    with pytest.raises(AttributeError):
        host.slots = 2  # type: ignore[misc]


# -- load_inventory: the file itself ---------------------------------------------------


def test_load_inventory_resolves_keys_next_to_the_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    private_key(tmp_path / "id")
    path = tmp_path / "inventory.yaml"
    path.write_text("all:\n  hosts:\n    h1: {ansible_ssh_private_key_file: id, slots: 3}\n")
    monkeypatch.chdir("/")
    inventory = load_inventory(path)
    assert inventory.path == str(path)
    (host,) = inventory.hosts
    assert (host.key_file, host.slots, host.source) == (str(tmp_path / "id"), 3, f"{path}:3")


def test_load_inventory_keeps_the_given_path_in_messages(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "inventory.yaml").write_text("all:\n  hosts:\n    h1: {slots: 0}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError) as caught:
        load_inventory("inventory.yaml")
    assert_error(caught.value, 3, "slots must be an integer >= 1, got 0", source="inventory.yaml")


def test_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert_error(caught.value, None, "file not found", source=str(path))
    assert str(caught.value) == f"{path}: file not found"


def test_load_directory(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path)
    assert_error(caught.value, None, "is a directory", source=str(tmp_path))


def test_load_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_bytes(b"all:\n  hosts:\n    h\xff1:\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert_error(caught.value, 3, "not UTF-8", source=str(path))


def test_load_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert_error(caught.value, 1, "the inventory is empty", source=str(path))


def test_repository_inventory_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inventory `lab up` writes is valid (its key files appear with `lab up`, in the lab's state
    under ~: fake them in a home of the test's own, so that it holds before any lab was up)."""
    copy = tmp_path / "inventory.yaml"
    copy.write_text(REPO_INVENTORY.read_text())
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".local" / "state" / "lab" / "labs" / "lab" / "ssh").mkdir(parents=True)
    private_key(tmp_path / ".local" / "state" / "lab" / "labs" / "lab" / "ssh" / "id_ed25519")
    inventory = load_inventory(copy)
    assert [h.name for h in inventory.hosts] == ["node1", "node2", "node3", "node4"]
    assert all(h.shared_dir == "/shared" and h.known_hosts for h in inventory.hosts)


# -- errors: each one names the exact line --------------------------------------------


ERRORS = [
    pytest.param("", 1, "the inventory is empty", id="empty"),
    pytest.param("# just a comment\n", 1, "the inventory is empty", id="only-comments"),
    pytest.param("""\
        all:
          hosts:
            h1: a: b
        """, 3, "invalid YAML: mapping values are not allowed here", id="yaml-syntax"),
    pytest.param("all:\n  hosts:\n\th1:\n", 3,
                 "invalid YAML: while scanning for the next token, found character '\\t'", id="yaml-tab"),
    pytest.param("""\
        all:
          hosts:
            h1: *nothing
        """, 3, "invalid YAML: found undefined alias 'nothing'", id="yaml-undefined-alias"),
    pytest.param("""\
        all:
          hosts: {h1: }
        ---
        all: {}
        """, 3, "invalid YAML: expected a single document in the stream, but found another document",
                 id="yaml-two-documents"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_user: \"a\x07\"}\n", 3, "unacceptable character #x0007",
                 id="yaml-control-character"),
    pytest.param("- h1\n- h2\n", 1, "the inventory must be a mapping of groups such as all:, got a list",
                 id="top-level-list"),
    pytest.param("hello\n", 1, "the inventory must be a mapping of groups such as all:, got 'hello'",
                 id="top-level-scalar"),
    pytest.param("""\
        hosts:
          h1:
        """, 1, "'hosts' must be inside a group, e.g. under all:", id="top-level-hosts"),
    pytest.param("""\
        all:
          vars: {slots: 2}
          children:
            gpu:
        """, 1, "the inventory defines no hosts", id="no-hosts"),
    pytest.param("""\
        all:
          hosts:
            h1:
              ansible_host: 10.0.0.1
              slot: 2
        """, 5, "unknown key 'slot': did you mean 'slots'?", id="typo-host-key"),
    pytest.param("""\
        all:
          vars:
            ansible_hots: 10.0.0.1
          hosts: {h1: }
        """, 3, "unknown key 'ansible_hots': did you mean 'ansible_host'?", id="typo-vars-key"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_hsot: a}\n", 3,
                 "unknown key 'ansible_hsot': did you mean 'ansible_host'?", id="typo-swapped-letters"),
    pytest.param("all:\n  hosts:\n    h1: {Slots: 2}\n", 3, "unknown key 'Slots': did you mean 'slots'?",
                 id="typo-case"),
    pytest.param("all:\n  hosts:\n    h1: {network_interfaces: eth0}\n", 3,
                 "unknown key 'network_interfaces': did you mean 'network_interface'?", id="typo-extra-letter"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_ssh_hots: a}\n", 3,
                 "unknown key 'ansible_ssh_hots': did you mean 'ansible_ssh_host'?", id="typo-old-name"),
    pytest.param("""\
        all:
          hosts:
            h1:
              vars: {slots: 2}
        """, 4, "'vars' is not a variable of host 'h1': hosts, vars and children go right under a group",
                 id="vars-under-a-host"),
    pytest.param("""\
        all:
          hosts:
            h1: {ansible_host: a.example, ansible_ssh_host: b.example}
        """, 3, "ansible_ssh_host and ansible_host (line 3) set the same thing; keep one", id="old-and-new-name"),
    pytest.param("""\
        all:
          children:
            gpu:
              hostz:
                h1:
        """, 4, "unknown key 'hostz': did you mean 'hosts'? (known: hosts, vars, children)",
                 id="unknown-group-key"),
    pytest.param("""\
        all:
          children:
            gpu:
              rack: 3
        """, 4, "unknown key 'rack' (known: hosts, vars, children)", id="group-keys-stay-strict"),
    pytest.param("""\
        all:
          children:
            gpu:
              gpus: 1
              hosts: {h1: }
        """, 4, "unknown key 'gpus' (known: hosts, vars, children; put variables under vars:)",
                 id="var-at-group-level"),
    pytest.param("""\
        all:
          hosts:
            h1:
              slots: two
        """, 4, "slots must be an integer >= 1, got 'two'", id="slots-string"),
    pytest.param("""\
        all:
          hosts:
            h1: {slots: 0}
        """, 3, "slots must be an integer >= 1, got 0", id="slots-zero"),
    pytest.param("""\
        all:
          vars:
            slots: yes
          hosts: {h1: }
        """, 3, "slots must be an integer >= 1, got yes", id="slots-bool"),
    pytest.param("""\
        all:
          hosts:
            h1: {slots: 1.5}
        """, 3, "slots must be an integer >= 1, got 1.5", id="slots-float"),
    pytest.param("""\
        all:
          hosts:
            h1:
              slots:
        """, 4, "slots must be an integer >= 1, got nothing", id="slots-empty"),
    pytest.param("""\
        all:
          hosts:
            h1:
              gpus: -1
        """, 4, "gpus must be an integer >= 0, got -1", id="gpus-negative"),
    pytest.param("""\
        all:
          hosts:
            h1:
              ansible_port: abc
        """, 4, "ansible_port must be an integer from 1 to 65535, got 'abc'", id="port-string"),
    pytest.param("""\
        all:
          hosts:
            h1: {ansible_port: "22"}
        """, 3, "ansible_port must be an integer from 1 to 65535, got '22'", id="port-quoted"),
    pytest.param("""\
        all:
          hosts:
            h1: {ansible_port: 0}
        """, 3, "ansible_port must be an integer from 1 to 65535, got 0", id="port-zero"),
    pytest.param("""\
        all:
          hosts:
            h1:
              ansible_port: 65536
        """, 4, "ansible_port must be an integer from 1 to 65535, got 65536", id="port-too-big"),
    pytest.param("""\
        all:
          hosts:
            h1:
              ansible_user:
                name: lab
        """, 5, "ansible_user must be a one-line string, got a mapping", id="user-mapping"),
    pytest.param("""\
        all:
          hosts:
            h1: {ansible_user: no}
        """, 3, "ansible_user must be a one-line string, got no", id="user-bool"),
    pytest.param("""\
        all:
          hosts:
            h1:
              ansible_host:
        """, 4, "ansible_host must be a one-line string, got nothing", id="host-empty"),
    pytest.param("""\
        all:
          hosts:
            h1:
              network_interface: "eth0\\neth1"
        """, 4, "network_interface must be a one-line string, got 'eth0\\neth1'", id="interface-two-lines"),
    pytest.param("all:\n  hosts:\n    h1: {network_interface: 'eth0; rm -rf /'}\n", 3,
                 "invalid network_interface 'eth0; rm -rf /' (a network interface name: 1 to 15 of letters, "
                 "digits, '_', '.', ':' and '-', not starting with '-')", id="interface-shell"),
    pytest.param("all:\n  hosts:\n    h1: {network_interface: enp0s31f6-too-long}\n", 3,
                 "invalid network_interface 'enp0s31f6-too-long'", id="interface-too-long"),
    pytest.param("all:\n  hosts:\n    h1: {network_interface: ../eth0}\n", 3,
                 "invalid network_interface '../eth0'", id="interface-slash"),
    pytest.param("all:\n  hosts:\n    h1: {network_interface: -eth0}\n", 3,
                 "invalid network_interface '-eth0'", id="interface-option"),
    pytest.param("all:\n  hosts:\n    h1: {network_interface: ..}\n", 3,
                 "invalid network_interface '..'", id="interface-dots"),
    pytest.param("all:\n  hosts:\n    h1: {data_address: '10.0.0.1; reboot'}\n", 3,
                 "invalid data_address '10.0.0.1; reboot' (an IPv4 or IPv6 address, or a DNS host name",
                 id="data-address-shell"),
    pytest.param("all:\n  hosts:\n    h1: {data_address: 10.0.0.300}\n", 3,
                 "invalid data_address '10.0.0.300'", id="data-address-not-an-address"),
    pytest.param("all:\n  hosts:\n    h1: {data_address: 'fe80::1%eth0;id'}\n", 3,
                 "invalid data_address 'fe80::1%eth0;id'", id="data-address-scope"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_host: '$(id)'}\n", 3, "invalid ansible_host '$(id)'",
                 id="ansible-host-shell"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_host: '-oProxyCommand=x'}\n", 3,
                 "invalid ansible_host '-oProxyCommand=x'", id="ansible-host-option"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_host: 'a..b'}\n", 3, "invalid ansible_host 'a..b'",
                 id="ansible-host-empty-label"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_ssh_host: 'a b'}\n", 3, "invalid ansible_ssh_host 'a b'",
                 id="old-name-validated-too"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_user: 'lab; id'}\n", 3,
                 "invalid ansible_user 'lab; id' (a user name: up to 32 of letters", id="user-shell"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_user: -root}\n", 3, "invalid ansible_user '-root'",
                 id="user-option"),
    pytest.param(f"all:\n  hosts:\n    h1: {{ansible_user: {'u' * 33}}}\n", 3, "invalid ansible_user 'uuu",
                 id="user-too-long"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_python_interpreter: '/usr/bin/python3 -c evil'}\n", 3,
                 "invalid ansible_python_interpreter '/usr/bin/python3 -c evil' (an absolute path or a command "
                 "name", id="python-spaces"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_python_interpreter: 'python3;id'}\n", 3,
                 "invalid ansible_python_interpreter 'python3;id'", id="python-semicolon"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_python_interpreter: venv/bin/python}\n", 3,
                 "invalid ansible_python_interpreter 'venv/bin/python'", id="python-relative-path"),
    pytest.param("all:\n  hosts:\n    h1: {shared_dir: '/nfs/$(id)'}\n", 3,
                 "invalid shared_dir '/nfs/$(id)' (an absolute path of letters", id="shared-dir-shell"),
    pytest.param("all:\n  hosts:\n    h1: {shared_dir: '/nfs/a b;c'}\n", 3, "invalid shared_dir '/nfs/a b;c'",
                 id="shared-dir-space"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_connection: docker, docker_container: '-it'}\n", 3,
                 "invalid docker_container '-it' (a Docker container name or id", id="container-option"),
    pytest.param("all:\n  hosts:\n    h1: {docker_container: 'a b'}\n", 3, "invalid docker_container 'a b'",
                 id="container-space"),
    pytest.param("all:\n  hosts:\n    h1: {ansible_python_interpreter: '$HOME/python'}\n", 3,
                 "invalid ansible_python_interpreter '$HOME/python'", id="python-dollar"),
    pytest.param("""\
        all:
          hosts:
            h1:
              ansible_connection: winrm
        """, 4, "ansible_connection must be one of ssh, local, docker, slurm, got 'winrm'", id="connection"),
    pytest.param("""\
        all:
          vars:
            ansible_user: lab
            ansible_password: secret
          hosts: {h1: }
        """, 4, "password authentication is not supported; use ansible_ssh_private_key_file", id="password"),
    pytest.param("""\
        all:
          hosts:
            h1: {ansible_ssh_pass: secret}
        """, 3, "password authentication is not supported", id="ssh-pass"),
    pytest.param("""\
        all:
          hosts:
            h1:
            h2:
            h1:
        """, 5, "duplicate key 'h1' (first at line 3)", id="duplicate-host-key"),
    pytest.param("""\
        all:
          hosts:
            h1:
              slots: 2
              gpus: 1
              slots: 3
        """, 6, "duplicate key 'slots' (first at line 4)", id="duplicate-var-key"),
    pytest.param("""\
        all:
          hosts: {h1: }
        all:
          hosts: {h2: }
        """, 3, "duplicate key 'all' (first at line 1)", id="duplicate-top-level-key"),
    pytest.param("""\
        all:
          hosts:
            h1: {slots: 2}
          children:
            gpu:
              hosts:
                h1: {gpus: 1}
        """, 7, "duplicate host 'h1' (first defined at line 3)", id="duplicate-host"),
    pytest.param("""\
        all:
          children:
            gpu:
              hosts: {h1: }
            rack:
              children:
                gpu:
                  vars: {gpus: 1}
        """, 7, "duplicate group 'gpu' (first defined at line 3)", id="duplicate-group"),
    pytest.param("""\
        all:
          hosts:
            web[01:03]:
        """, 3, "invalid host name 'web[01:03]': use letters, digits, '.', '-' and '_'", id="host-range"),
    pytest.param("""\
        all:
          hosts:
            my host:
        """, 3, "invalid host name 'my host'", id="host-name-space"),
    pytest.param("""\
        all:
          hosts:
            yes:
        """, 3, "host name yes reads as a YAML boolean; quote it", id="host-name-bool"),
    pytest.param("""\
        all:
          hosts:
            ~: {slots: 2}
        """, 3, "a key must be a name, got ~", id="host-name-null"),
    pytest.param("""\
        all:
          hosts:
            ? [h1, h2]
            : {slots: 2}
        """, 3, "a key must be a name, got a list", id="host-name-list"),
    pytest.param("""\
        all:
          children:
            gpu/nodes:
              hosts: {h1: }
        """, 3, "invalid group name 'gpu/nodes'", id="group-name"),
    pytest.param("""\
        all:
          hosts:
            - h1
            - h2
        """, 3, "hosts of group 'all' must be a mapping, got a list", id="hosts-list"),
    pytest.param("""\
        all:
          hosts:
            h1: 10.0.0.1
        """, 3, "host 'h1' must be a mapping, got '10.0.0.1'", id="host-scalar"),
    pytest.param("""\
        all:
          vars: [slots]
          hosts: {h1: }
        """, 2, "vars of group 'all' must be a mapping, got a list", id="vars-list"),
    pytest.param("""\
        all:
          children: [gpu]
        """, 2, "children of group 'all' must be a mapping, got a list", id="children-list"),
    pytest.param("""\
        all:
          children:
            gpu: h1
        """, 3, "group 'gpu' must be a mapping, got 'h1'", id="group-scalar"),
    pytest.param("""\
        all:
          hosts: {h1: }
          children:
            gpu:
              children:
                all:
        """, 6, "'all' contains every group; it cannot be a child group", id="all-as-child"),
    pytest.param("""\
        all:
          children:
            a:
              children:
                b:
                  hosts: {h1: }
                  children:
                    a:
        """, 5, "group cycle: 'b' is listed under 'a', which is under 'b'", id="group-cycle"),
    pytest.param("""\
        all:
          hosts: {h1: }
          children:
            a: &a
              children:
                a: *a
        """, 6, "group cycle: 'a' is listed under itself", id="group-cycle-through-alias"),
    pytest.param("""\
        all:
          hosts:
            h1: &h
              <<: *h
        """, 3, "a merge (<<) cannot bring in the mapping it is part of", id="recursive-merge"),
    pytest.param("""\
        all:
          hosts:
            h1:
              <<: 5
        """, 4, "a merge (<<) value must be a mapping, got 5", id="merge-scalar"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), ERRORS)
def test_error(text: str, line: int, fragment: str) -> None:
    assert_error(parse_error(text), line, fragment)


def test_error_missing_key_file(tmp_path: Path) -> None:
    err = parse_error("""\
        all:
          hosts:
            h1:
              ansible_ssh_private_key_file: keys/missing
        """, tmp_path)
    assert_error(err, 4, f"ansible_ssh_private_key_file: {tmp_path / 'keys' / 'missing'} does not exist")


def test_a_hosts_requirements_file_is_read_relative_to_the_inventory_and_must_be_there(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("tqdm\n")
    (tmp_path / "gpu.txt").write_text("tqdm\n")
    inventory = parse("""\
        all:
          vars: {requirements: requirements.txt}
          hosts: {h1: , h2: {requirements: gpu.txt}, h3: }
        """, tmp_path)
    assert [h.requirements for h in inventory.hosts] == [str(tmp_path / "requirements.txt"), str(tmp_path / "gpu.txt"),
                                                         str(tmp_path / "requirements.txt")]
    err = parse_error("""\
        all:
          vars: {requirements: requirements.txt}
          hosts:
            h1:
            h2: {requirements: extra.txt}
        """, tmp_path)
    assert_error(err, 5, f"requirements: {tmp_path / 'extra.txt'} does not exist")


def test_error_key_file_in_group_vars_is_reported_where_it_is_written(tmp_path: Path) -> None:
    err = parse_error("""\
        all:
          vars:
            ansible_ssh_private_key_file: /no/such/key
          hosts: {h1: }
        """, tmp_path)
    assert_error(err, 3, "ansible_ssh_private_key_file: /no/such/key does not exist")


def test_error_key_file_is_a_directory(tmp_path: Path) -> None:
    err = parse_error("""\
        all:
          hosts:
            h1: {ansible_ssh_private_key_file: .}
        """, tmp_path)
    assert_error(err, 3, f"ansible_ssh_private_key_file: {tmp_path} is not a file")


def test_error_known_hosts_file_is_a_directory(tmp_path: Path) -> None:
    err = parse_error("""\
        all:
          hosts:
            h1: {ssh_known_hosts_file: .}
        """, tmp_path)
    assert_error(err, 3, f"ssh_known_hosts_file: {tmp_path} is a directory, not a file")


def test_error_known_hosts_file_in_a_missing_directory(tmp_path: Path) -> None:
    err = parse_error("""\
        all:
          vars:
            ssh_known_hosts_file: nowhere/known_hosts
          hosts: {h1: }
        """, tmp_path)
    assert_error(err, 3, f"ssh_known_hosts_file: directory {tmp_path / 'nowhere'} does not exist")


def test_error_in_an_aliased_mapping_names_the_anchor_line() -> None:
    err = parse_error("""\
        all:
          hosts:
            h1: &common
              slots: 0
            h2: *common
        """)
    assert_error(err, 4, "slots must be an integer >= 1, got 0")


def test_error_long_values_are_cut_to_one_short_line() -> None:
    err = parse_error(f"""\
        all:
          hosts:
            h1: {{slots: {"x" * 200}}}
        """)
    assert_error(err, 3, "slots must be an integer >= 1, got '" + "x" * 57 + "...'")


def test_shared_dir_is_an_absolute_host_path(tmp_path: Path) -> None:
    inventory = parse_inventory("all:\n  vars:\n    shared_dir: /shared/\n  hosts:\n    a:\n",
                                "inv.yaml", str(tmp_path))
    assert inventory.hosts[0].shared_dir == "/shared"
    with pytest.raises(InventoryError, match=r"^inv.yaml:3: shared_dir must be an absolute path"):
        parse_inventory("all:\n  vars:\n    shared_dir: shared\n  hosts:\n    a:\n", "inv.yaml", str(tmp_path))


# -- an existing Ansible inventory: the lab's keys are read, the others ignored ---------


def test_variables_the_lab_does_not_use_are_ignored_and_named_once_in_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lab.inventory"):
        inventory = hosts(parse("""\
            all:
              vars:
                ntp_server: ntp.example.com
                ansible_become_user: root
                ansible_ssh_common_args: -o ProxyJump=bastion
              hosts:
                h1: {ansible_host: 10.0.0.1, ntp_server: ntp2.example.com, rack: 3}
              children:
                web:
                  vars: {http_port: 80, packages: [nginx, {name: certbot}], ansible_become_method: su}
                  hosts: {h2: {slots: 2}}
            """))
    assert (inventory["h1"].address, inventory["h2"].slots) == ("10.0.0.1", 2)
    records = [r for r in caplog.records if r.name == "lab.inventory"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "inv.yaml: ignored variables the lab does not use: ntp_server, ansible_become_user, "
                       "ansible_ssh_common_args, rack, http_port, packages, ansible_become_method")]


def test_an_inventory_with_nothing_to_ignore_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="lab.inventory"):
        parse("all:\n  hosts: {h1: {slots: 2}}\n")
    assert [r for r in caplog.records if r.name == "lab.inventory"] == []


def test_ansibles_older_names_are_read_as_the_current_ones(tmp_path: Path) -> None:
    private_key(tmp_path / "id")
    (host,) = parse("""\
        all:
          hosts:
            h1: {ansible_ssh_host: 10.0.0.9, ansible_ssh_port: 2222, ansible_ssh_user: lab,
                 ansible_private_key_file: id}
        """, tmp_path).hosts
    assert (host.address, host.port, host.user, host.key_file) == ("10.0.0.9", 2222, "lab", str(tmp_path / "id"))


@pytest.mark.parametrize("key, value", [
    ("ansible_host", "10.0.0.1"), ("ansible_host", "::1"), ("ansible_host", "fe80::1%eth0"),
    ("ansible_host", "node-1.example.com."), ("ansible_host", "my_host"), ("ansible_host", "localhost"),
    ("data_address", "2001:db8::7"), ("data_address", "gpu01.cluster.internal"),
    ("network_interface", "eth0"), ("network_interface", "eth0:1"), ("network_interface", "ib0.8001"),
    ("network_interface", "enp0s31f6"), ("network_interface", "br-0123456789ab"), ("network_interface", "lo"),
    ("ansible_user", "lab"), ("ansible_user", "john.doe"), ("ansible_user", "_svc"), ("ansible_user", "svc$"),
    ("ansible_user", "Admin"), ("ansible_python_interpreter", "/opt/venv/bin/python3.11"),
    ("ansible_python_interpreter", "python3.11"), ("ansible_python_interpreter", "pypy3"),
    ("ansible_python_interpreter", "/usr/local/bin/lab-python"),
])
def test_valid_values_pass_the_strict_patterns(key: str, value: str) -> None:
    (host,) = parse(f"all:\n  hosts:\n    h1: {{{key}: '{value}'}}\n").hosts
    field = {"ansible_host": "address", "ansible_user": "user", "ansible_python_interpreter": "python"}.get(key, key)
    assert getattr(host, field) == value


# -- the private key's mode ------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o700 | 0o044])
def test_a_private_key_others_can_read_is_refused_as_ssh_refuses_it(tmp_path: Path, mode: int) -> None:
    key = tmp_path / "id"
    key.write_text("key\n")
    key.chmod(mode)
    err = parse_error("all:\n  vars:\n    ansible_ssh_private_key_file: id\n  hosts: {h1: }\n", tmp_path)
    assert_error(err, 3, f"ansible_ssh_private_key_file: key file {key} has mode {mode:04o}; a private key "
                         f"must not be readable by others (chmod 600 {key})")


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_a_private_key_only_its_owner_can_read_is_accepted(tmp_path: Path, mode: int) -> None:
    key = tmp_path / "id"
    key.write_text("key\n")
    key.chmod(mode)
    (host,) = parse("all:\n  hosts: {h1: {ansible_ssh_private_key_file: id}}\n", tmp_path).hosts
    assert host.key_file == str(key)


# -- hostile files: small, and quickly refused -----------------------------------------


def timed_error(text: str, limit: float = 10.0) -> InventoryError:  # (a loaded CI machine; unbounded is hours)
    started = time.monotonic()
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml", "/nonexistent")
    assert time.monotonic() - started < limit
    return caught.value


def test_a_merge_bomb_is_refused_at_once() -> None:
    text = (HOSTILE / "merge_bomb.yaml").read_text()
    assert len(text) < 1024
    err = timed_error(text)  # 10**7 entries for a reader that copies merges
    assert_error(err, 5, "the merges (<<) here bring in more than 10,000 entries (each counted as often as it "
                         "is merged): a merge bomb?")


def test_a_merge_bomb_is_refused_where_it_passes_the_bound_and_unread_it_costs_nothing() -> None:
    lines = ["all:", "  vars:", "    x0: &a0 {slots: 1}"]
    lines += [f"    x{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 10)}]}}" for i in range(1, 9)]
    lines += ["  hosts: {h1: }"]
    started = time.monotonic()  # in a variable the lab does not use, it is never read
    assert parse_inventory("\n".join(lines) + "\n", "inv.yaml", "/").hosts[0].slots == 1
    assert time.monotonic() - started < 10
    lines[-1] = "  hosts: {h1: {<<: *a8}}"  # x5 merges x4 (10**4 entries) ten times
    assert_error(timed_error("\n".join(lines) + "\n"), 8, "a merge bomb?")


def test_merges_are_read_once_per_mapping_so_a_big_inventory_is_quick() -> None:
    lines = ["all:", "  vars:", "    defaults: &d {" + ", ".join(f"v{i}: {i}" for i in range(9)) + ", slots: 2}",
             "  hosts:"]
    lines += [f"    h{i}: {{<<: *d, gpus: 1}}" for i in range(2000)]
    started = time.monotonic()
    inventory = parse_inventory("\n".join(lines) + "\n", "inv.yaml", "/nonexistent")
    assert time.monotonic() - started < 10
    assert inventory.world_size == 4000 and all(h.gpus == 1 for h in inventory.hosts)


def test_merges_that_copy_too_much_in_all_are_refused() -> None:
    lines = ["all:", "  vars:", "    big: &big {" + ", ".join(f"v{i}: 0" for i in range(900)) + "}", "  hosts:"]
    lines += [f"    h{i}: {{<<: *big}}" for i in range(1200)]  # 1.08 million entries copied
    err = timed_error("\n".join(lines) + "\n", limit=15)
    assert_error(err, 5 + 1111, "the merges (<<) of this file copy more than 1,000,000 entries in all")


def test_a_long_chain_of_merges_is_refused_not_a_recursion_error() -> None:
    lines = ["all:", "  vars:", "    m0: &m0 {slots: 1}"]
    lines += [f"    m{i}: &m{i} {{<<: *m{i - 1}}}" for i in range(1, 2000)]
    lines += ["  hosts: {h1: {<<: *m1999}}"]
    err = timed_error("\n".join(lines) + "\n")
    assert err.line is not None and "merges (<<) are nested more than 50 deep here" in str(err)


def test_aliases_stay_shared_so_a_billion_laughs_is_quick() -> None:
    """Plain aliases (no merges) of lists of aliases: 10**9 items if expanded. The lab never
    expands them: an ignored variable is not read, a read one is refused by its type."""
    lines = ["all:", "  vars:", "    l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    lines += ["    ansible_ssh_extra_args: *l8", "    laughs: *l8", "  hosts:", "    h1: {tags: *l8}"]
    text = "\n".join(lines) + "\n"
    started = time.monotonic()
    (host,) = parse_inventory(text, "inv.yaml", "/nonexistent").hosts
    assert host.name == "h1" and time.monotonic() - started < 10
    for key in ("ansible_host", "grade_users", "slots"):
        err = timed_error(text.replace("tags: *l8", f"{key}: *l8"))
        assert err.line == 11 and "must be a list of user names, got" in str(err) or "got a list" in str(err), err


def test_groups_through_aliases_are_read_once_each() -> None:
    lines = ["all:", "  hosts: {h1: }", "  children:", "    c0: &c0 {hosts: {h1: }}"]
    lines += [f"    c{i}: &c{i} {{children: {{{', '.join(f'c{i}_{j}: *c{i - 1}' for j in range(10))}}}}}"
              for i in range(1, 9)]
    started = time.monotonic()
    inventory = parse_inventory("\n".join(lines) + "\n", "inv.yaml", "/nonexistent")
    assert time.monotonic() - started < 10 and len(inventory.hosts[0].groups) == 9 + 8 * 10


@pytest.mark.parametrize("text, line, fragment", [
    pytest.param((HOSTILE / "deep_nesting.yaml").read_text(), 5, "the YAML is nested more than 100 levels deep",
                 id="5000-brackets"),
    pytest.param("all:\n  hosts:\n    h1: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", 3,
                 "the YAML is nested more than 100 levels deep", id="5000-flow-mappings"),
    pytest.param("all:\n  hosts:\n    h1:\n" + "".join(" " * (6 + 2 * i) + f"k{i}:\n" for i in range(150)), 100,
                 "the YAML is nested more than 100 levels deep", id="deep-block-mappings"),
    pytest.param("all:\n  hosts: {h1: }\n  children:\n    x: &x\n      children: {"
                 + ", ".join(f"g{i}: *x" for i in range(300)) + "}\n", 5,
                 "groups are nested more than 50 deep here", id="groups-nested-through-an-alias"),
    pytest.param("all:\n  hosts: {h1: }\n" + "".join(f"g{i}:\n  children: {{g{i + 1}: }}\n" for i in range(3000)),
                 103, "groups are nested more than 50 deep here", id="a-long-chain-of-bare-groups"),
    pytest.param("all:\n  hosts: {h1: }\n" + "".join(f"g{i}:\n  children: {{g{i + 1}: }}\n"
                                                    for i in reversed(range(3000))),
                 105, "groups are nested more than 50 deep here", id="a-long-chain-of-bare-groups-backwards"),
])
def test_deep_nesting_is_bad_input_with_its_line_not_a_recursion_error(text: str, line: int, fragment: str) -> None:
    assert_error(timed_error(text), line, fragment)


def test_env_is_a_mapping_for_the_ranks_and_a_hosts_replaces_its_groups() -> None:
    inv = parse("""
        all:
          vars:
            env: {NCCL_DEBUG: INFO, OMP_NUM_THREADS: 4, FLAG: true}
          hosts:
            a:
            b: {env: {ONLY_B: "x y"}}
        """)
    assert {h.name: dict(h.env) for h in inv.hosts} == {
        "a": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4", "FLAG": "true"}, "b": {"ONLY_B": "x y"}}


@pytest.mark.parametrize("env, words", [
    ("[A, B]", "env must be a mapping of variable names to values"),
    ("{1BAD: x}", "'1BAD' is not a variable name"),
    ("{MASTER_PORT: 1}", "MASTER_PORT is the run's own setting"),
    ("{LAB_TOKEN: x}", "LAB_TOKEN is the run's own setting"),
    ("{A: [1, 2]}", "the value of A must be a string or a number"),
])
def test_a_bad_env_is_one_line_with_its_place(env: str, words: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse(f"all:\n  hosts:\n    a:\n      env: {env}\n")
    assert str(caught.value).startswith("inv.yaml:4") and words in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)
