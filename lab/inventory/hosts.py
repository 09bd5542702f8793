"""Reading an inventory: which hosts the lab runs on, from an Ansible-style YAML file (read by
``lab.inventory.ansible``: layout, inheritance, bounds, ``file:line`` errors) into the model's
``Host``s (``lab.inventory.model``), so an existing Ansible inventory works; and writing one back
(``inventory_text``).

``HOST_KEYS`` is every variable a host or a group may set: the ``Host`` field it fills, how its
value is read, and what it means (the reference's inventory section is made from it). It is the
keys each transport declares beside itself (``TRANSPORT_KEYS``: the SSH transport's login, the
docker transport's container) and the inventory's own (the address, the connection, slots,
GPUs, the data plane...), merged; so the reader checks a host's keys (an unknown one ignored, a
near miss refused, a wrong value refused) as the transports declare them. The values the lab
passes to hosts (addresses, user, NIC, interpreter) must match strict patterns, and a private
key file must not be open to others.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from lab.core import rankenv
from lab.errors import UsageError
from lab.inventory.ansible import read_ansible, read_text
from lab.inventory.keys import (
    COMMAND,
    INTERFACE,
    NAME,
    PLAIN_PATH,
    USER_NAME,
    InvalidValue,
    Key,
    address,
    boolean,
    integer,
    invalid_value,
    matching,
    merged,
    shown,
    text_value,
)
from lab.inventory.model import CONNECTIONS, DEFAULT_PYTHON, Connection, Host, Inventory
from lab.transport.docker.keys import DOCKER_KEYS
from lab.transport.ssh.keys import SSH_KEYS

_AUTO_PYTHON = ("auto", "auto_silent", "auto_legacy", "auto_legacy_silent")  # Ansible's discovery


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and check the inventory file at ``path``."""
    source = os.fspath(path)
    return parse_inventory(read_text(source, "an inventory file"), source, os.path.dirname(os.path.abspath(source)))


def parse_inventory(text: str, source: str, base_dir: str) -> Inventory:
    """Check inventory ``text``; ``source`` names it in errors, ``base_dir`` anchors relative paths."""
    return Inventory(source, tuple(_host(*entry) for entry in read_ansible(text, source, base_dir, HOST_KEYS)))


def _host(name: str, values: dict[str, object], groups: tuple[str, ...], source: str) -> Host:
    values.setdefault("address", name)
    if values.get("connection") == "docker":
        values.setdefault("container", name)
    else:
        values.pop("container", None)
    return Host(name=name, **values, groups=groups, source=source)  # type: ignore[arg-type]


def local_inventory(nproc: int, gpus: int = 0) -> Inventory:
    """An inventory of this machine alone, running ``nproc`` ranks (with ``gpus`` GPUs)."""
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    host = Host("local", "127.0.0.1", connection="local", slots=nproc, gpus=gpus, source="<local>")
    return Inventory("<local>", (host,))


# -- the values of a host -------------------------------------------------------------


def _host_directory(key: str, node: Node, base_dir: str) -> str:
    """An absolute directory on the host itself (not resolved here)."""
    value = text_value(key, node, base_dir)
    if not value.startswith("/"):
        raise InvalidValue(f"{key} must be an absolute path on the host, got {shown(node)}")
    if not PLAIN_PATH.match(value):
        raise invalid_value(key, value, "an absolute path of letters, digits and '_', '.', '/', '+', '@', ',', '=', "
                                        "'-' only")
    return value.rstrip("/") or "/"


def _local_file(key: str, node: Node, base_dir: str) -> str:
    """A file on this machine, relative to the inventory's directory."""
    path = os.path.abspath(os.path.join(base_dir, os.path.expanduser(text_value(key, node, base_dir))))
    if not os.path.isfile(path):
        raise InvalidValue(f"{key}: {path} is not a file" if os.path.exists(path) else f"{key}: {path} does not exist")
    return path


def _connection(key: str, node: Node, base_dir: str) -> str:
    value = text_value(key, node, base_dir)
    if value not in CONNECTIONS:
        raise InvalidValue(f"{key} must be one of {', '.join(CONNECTIONS)}, got {shown(node)}")
    return value


LAB_NAME = re.compile(r"[a-z][a-z0-9-]{0,23}\Z")  # a container lab's name (lab up --name)
_interface = matching(INTERFACE, "a network interface name: 1 to 15 of letters, digits, '_', '.', ':' and '-', "
                                 "not starting with '-'")


def _python(key: str, node: Node, base_dir: str) -> str:
    value = text_value(key, node, base_dir)
    if value in _AUTO_PYTHON:
        return DEFAULT_PYTHON
    if not COMMAND.match(value):
        raise invalid_value(key, value, "an absolute path or a command name, of letters, digits and '_', '.', '/', "
                                        "'+', '-' only")
    return value


def _user_names(key: str, node: Node, base_dir: str) -> tuple[str, ...]:
    """A list of user names (a YAML sequence, or one string of names split by commas)."""
    if isinstance(node, SequenceNode):
        names = [text_value(key, item, base_dir) for item in node.value]
    else:
        names = [name.strip() for name in text_value(key, node, base_dir).split(",")]
    bad = next((name for name in names if not USER_NAME.match(name)), None)
    if not names or bad is not None:
        raise InvalidValue(f"{key} must be a list of user names, got {shown(node) if bad is None else repr(bad)}")
    if len(set(names)) != len(names):
        raise InvalidValue(f"{key} names a user twice: {', '.join(names)}")
    return tuple(names)


def _environment(key: str, node: Node, base_dir: str) -> tuple[tuple[str, str], ...]:
    """A mapping of variable names to values (numbers and booleans as written): the ranks' settings."""
    if not isinstance(node, MappingNode):
        raise InvalidValue(f"{key} must be a mapping of variable names to values, got {shown(node)}")
    pairs = []
    for name_node, value_node in node.value:
        name = text_value(key, name_node, base_dir)
        if not rankenv.NAME.match(name):
            raise InvalidValue(f"{key}: {name!r} is not a variable name (letters, digits and '_', not starting "
                               "with a digit)")
        if name in rankenv.RESERVED or name.startswith(rankenv.RESERVED_PREFIXES):
            raise InvalidValue(f"{key}: {name} is the run's own setting, not the inventory's")
        if not isinstance(value_node, ScalarNode):
            raise InvalidValue(f"{key}: the value of {name} must be a string or a number, got {shown(value_node)}")
        pairs.append((name, str(value_node.value)))
    return tuple(pairs)


# The keys each transport reads, declared beside it; `local` and `slurm` read none but the
# inventory's own (a local host is this machine, a Slurm node is named by the host's name).
TRANSPORT_KEYS: dict[Connection, Mapping[str, Key]] = {"ssh": SSH_KEYS, "local": {}, "docker": DOCKER_KEYS,
                                                      "slurm": {}}

# Each key a host or group may set: the transports' and the inventory's own, each with the Host field
# it fills, how its value is read, what it means. In this order: the reference lists them so,
# inventory_text writes them so, and a near miss of two keys is taken for the first.
# (Ansible's older names, lab.inventory.ansible.SYNONYMS, are read as theirs.)
HOST_KEYS: dict[str, Key] = merged(
    {"ansible_host": Key("address", address, "the host's address, where SSH reaches it: an IPv4 or IPv6 address or "
                                             "a DNS host name (default: the host's name)")},
    SSH_KEYS,
    {"ansible_connection": Key("connection", _connection, "how the lab reaches the host: `ssh` (default), `local` "
                                                          "(this machine), `docker` (a container), `slurm` (a job "
                                                          "step on a node of the Slurm allocation)"),
     "ansible_python_interpreter": Key("python", _python, "the Python that has torch on the host (default `python3`; "
                                                          "Ansible's `auto` values mean `python3`)"),
     "slots": Key("slots", integer(1), "ranks on the host (default 1); ranks are numbered host by host in file order"),
     "gpus": Key("gpus", integer(0), "GPUs on the host (default 0)"),
     "data_address": Key("data_address", address, "the address peers use for the data plane, when it differs from "
                                                   "the one SSH reaches; rank 0's is MASTER_ADDR"),
     "network_interface": Key("network_interface", _interface, "the NIC for the data plane (sets "
                                                               "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)"),
     "shared_dir": Key("shared_dir", _host_directory, "an absolute directory every host mounts (NFS, a shared "
                                                      "volume): where `file://` rendezvous goes")},
    DOCKER_KEYS,
    {"grade_users": Key("grade_users", _user_names, "users `lab grade --parallel K` logs in as, share N as the Nth, "
                                                    "so the submissions graded at once on a host are different users "
                                                    "(a list, or names split by commas)"),
     "env": Key("env", _environment, "settings for the host's ranks, a mapping (NCCL_DEBUG: INFO); a host's replaces "
                                     "its group's, as any variable's; `--env` and `--env-file` come over them"),
     "requirements": Key("requirements", _local_file, "a requirements file (pip's format) on this machine, relative "
                                                      "to the file's directory: what `lab launch` installs on the "
                                                      "host for its ranks, once (`--requirements` comes over it)"),
     "ansible_become": Key("become", boolean, "become root with `sudo -n` (passwordless) where the lab needs root on "
                                              "the host: `lab net overlay --hosts` (default false)"),
     "overlay": Key("overlay", matching(LAB_NAME, "a lab's name: a lowercase letter, then up to 23 lowercase letters, "
                                                  "digits or '-'"),
                    "the container lab whose WireGuard overlay carries the host's data plane (`lab net overlay up` "
                    "writes it): `lab doctor` reports the overlay's state"),
     "machine": Key("machine", matching(NAME, "a machine's name in machines.yaml"),
                    "the Docker machine of machines.yaml the host's container runs on (`lab up --machines` writes "
                    "it)")},
)


def inventory_text(hosts: Sequence[Host], about: str, changes: Mapping[str, Mapping[str, object]]) -> str:
    """An inventory of ``hosts`` as they were read (every variable that differs from its default, on
    the host itself; paths absolute; each group a group of its own), each host's ``changes`` (its
    variables by key) applied: what ``lab net overlay up --hosts`` writes."""
    defaults = Host("", "")
    entries: dict[str, dict[str, object]] = {}
    for host in hosts:
        values: dict[str, object] = {"ansible_host": host.address}
        for key, spec in HOST_KEYS.items():
            value = getattr(host, spec.attribute)
            if key != "ansible_host" and value != getattr(defaults, spec.attribute):
                values[key] = dict(value) if key == "env" else list(value) if isinstance(value, tuple) else value
        if host.connection != "docker":
            values.pop("docker_container", None)
        entries[host.name] = {**values, **changes.get(host.name, {})}
    document: dict[str, object] = {"all": {"hosts": entries}}
    for group in dict.fromkeys(g for host in hosts for g in host.groups):
        document[group] = {"hosts": {host.name: None for host in hosts if group in host.groups}}
    return f"# {about}\n" + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
