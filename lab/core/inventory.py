"""The inventory: which hosts the lab runs on, read from an Ansible-style YAML file.

The layout is Ansible's YAML inventory, so an existing Ansible inventory works::

    all:
      vars: {ansible_user: lab}
      hosts:
        h1: {ansible_host: 172.28.0.11}
      children:
        gpu:
          vars: {gpus: 1}
          hosts:
            h2: {ansible_host: 10.0.0.2, slots: 2}

Variables inherit as in Ansible: ``all`` vars < parent group vars < child group
vars < host vars (groups at the same depth apply in name order). Top-level groups
other than ``all`` are children of ``all``. A group may be listed bare (``gpu:``)
under another group to make it a child there, and a host bare (``h1:``) to add it
to one more group; defining the same host or group with content twice is an error.

Variables the lab does not use (an Ansible inventory's own: ``ntp_server``,
``ansible_become_user``...) are ignored, and logged once at INFO on the "lab.inventory"
logger (``-v``); a name one edit from one the lab reads (``slot``, ``ansible_hots``) is an
error that says which was meant. The values the lab passes to hosts (addresses, user, NIC,
interpreter) must match strict patterns, and a private key file must not be open to others.

The file is read as a YAML node tree (``yaml.compose``), not as Python data, so
every error names its exact line and duplicate keys (which PyYAML silently
collapses) are caught. Aliases stay shared nodes, merges (``<<``) are read once per
mapping and bounded, and nesting is bounded, so no small file can take long or
exhaust the stack. Every problem raises ``InventoryError`` (``file:line: ...``).
"""
from __future__ import annotations

import ipaddress
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from lab.errors import InventoryError, UsageError

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"

_DEFAULT_PYTHON = "python3"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_GROUP_KEYS = ("hosts", "vars", "children")
Connection = Literal["ssh", "local", "docker", "slurm"]
_CONNECTIONS: tuple[Connection, ...] = get_args(Connection)
_AUTO_PYTHON = ("auto", "auto_silent", "auto_legacy", "auto_legacy_silent")  # Ansible's discovery
_PASSWORDS = ("ansible_password", "ansible_ssh_pass")
# Ansible's older names, still read by its ssh connection: the lab reads them as the new ones.
_SYNONYMS = {"ansible_ssh_host": "ansible_host", "ansible_ssh_port": "ansible_port",
             "ansible_ssh_user": "ansible_user", "ansible_private_key_file": "ansible_ssh_private_key_file"}
_INTS = yaml.constructor.SafeConstructor()
_MAX_YAML_DEPTH = 100  # nested YAML collections
_MAX_GROUP_DEPTH = 50  # groups under groups
_MAX_MERGE_DEPTH = 50  # mappings merged into mappings merged into...
_MAX_MERGED = 10_000  # entries one mapping's merges bring in, counted as often as they are merged
_MAX_MERGE_WORK = 1_000_000  # entries copied by every merge of the file
_log = logging.getLogger("lab.inventory")


@dataclass(frozen=True)
class Host:
    """One machine (or container) the lab starts ranks on."""

    name: str
    address: str  # ansible_host, else the name
    port: int = 22
    user: str | None = None
    key_file: str | None = None  # absolute path
    known_hosts: str | None = None  # absolute path of the lab's known_hosts file for this host
    connection: Connection = "ssh"
    python: str = _DEFAULT_PYTHON
    slots: int = 1  # ranks on this host
    gpus: int = 0
    data_address: str | None = None  # the address peers use for the data plane, if not `address`
    network_interface: str | None = None  # the NIC for the data plane (GLOO_SOCKET_IFNAME)
    shared_dir: str | None = None  # a directory every host mounts (NFS...): file:// rendezvous
    container: str | None = None  # the container name, for connection docker
    machine: str | None = None  # the Docker machine the host's container runs on (lab up --machines)
    grade_users: tuple[str, ...] = ()  # lab grade's share N logs in as the Nth (else as `user`)
    groups: tuple[str, ...] = ()  # every group the host is in, `all` left out, in file order
    source: str = ""  # "inventory.yaml:12": where the host is defined

    @property
    def is_local(self) -> bool:
        return self.connection == "local"


@dataclass(frozen=True)
class Inventory:
    path: str
    hosts: tuple[Host, ...]  # in file order (first appearance)

    @property
    def world_size(self) -> int:
        return sum(host.slots for host in self.hosts)


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and check the inventory file at ``path``."""
    source = os.fspath(path)
    return parse_inventory(read_text(source, "an inventory file"), source, os.path.dirname(os.path.abspath(source)))


def read_text(source: str, kind: str) -> str:
    """The UTF-8 text of the file ``source`` (``kind`` names what it should be), or InventoryError."""
    try:
        with open(source, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        raise InventoryError(source, None, "file not found") from None
    except IsADirectoryError:
        raise InventoryError(source, None, f"is a directory, not {kind}") from None
    except OSError as err:
        raise InventoryError(source, None, f"cannot read the file: {err.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InventoryError(source, line, "the file is not UTF-8 text") from None


def parse_inventory(text: str, source: str, base_dir: str) -> Inventory:
    """Check inventory ``text``; ``source`` names it in errors, ``base_dir`` anchors relative paths."""
    return Inventory(source, tuple(_host(*entry) for entry in read_ansible(text, source, base_dir, VARS)))


def _host(name: str, values: dict[str, object], groups: tuple[str, ...], source: str) -> Host:
    values.setdefault("address", name)
    if values.get("connection") == "docker":
        values.setdefault("container", name)
    else:
        values.pop("container", None)
    return Host(name=name, **values, groups=groups, source=source)  # type: ignore[arg-type]


Entry = tuple[str, dict[str, object], tuple[str, ...], str]  # name, its variables, its groups, "file:line"


def read_ansible(text: str, source: str, base_dir: str, table: Mapping[str, tuple[str, Reader]],
                 what: str = "the inventory") -> list[Entry]:
    """The hosts of an Ansible-style YAML file (``what`` names it in errors), each with the
    variables ``table`` reads (name -> the field it fills and its reader; see ``VARS``),
    inherited through its groups."""
    root = _compose(text, source)
    if root is None or _is_null(root):
        raise InventoryError(source, 1, f"{what} is empty")
    parser = _Parser(source, base_dir, table)
    try:
        parser.read(root)
        hosts = parser.build()
    except RecursionError:  # (the bounds above come first; this is the last line of defence)
        raise InventoryError(source, None, f"{what} is nested too deep to read") from None
    if not hosts:
        raise InventoryError(source, _line(root), f"{what} defines no hosts")
    if parser.ignored:
        _log.info("%s: ignored variables the lab does not use: %s", source,
                  ", ".join(_one_line(name) for name in parser.ignored))
    return hosts


def local_inventory(nproc: int, gpus: int = 0) -> Inventory:
    """An inventory of this machine alone, running ``nproc`` ranks (with ``gpus`` GPUs)."""
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    host = Host("local", "127.0.0.1", connection="local", slots=nproc, gpus=gpus, source="<local>")
    return Inventory("<local>", (host,))


ALLOCATION = "slurm"  # --hosts slurm: the nodes of the Slurm allocation the lab runs in


def allocation_inventory(environ: Mapping[str, str], python: str) -> Inventory:
    """The nodes of the Slurm allocation the lab runs in (``salloc``, ``sbatch``), read from its
    environment (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE), each reached by a job step of its own
    (``connection: slurm``) and running ``python``: this one, as a cluster's nodes share it. Their
    ``shared_dir`` (file:// rendezvous) is LAB_SHARED_DIR, a directory every node mounts, if set."""
    from lab.rank.node import per_node_counts

    nodelist, tasks = environ.get("SLURM_JOB_NODELIST"), environ.get("SLURM_TASKS_PER_NODE")
    if not environ.get("SLURM_JOB_ID") or not nodelist or not tasks:
        raise UsageError("--hosts slurm reads the nodes of the Slurm allocation the lab runs in: run it inside "
                         "one (salloc -N2 --ntasks-per-node=2, or an sbatch script); SLURM_JOB_ID, "
                         "SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE are not all set here")
    try:
        nodes, counts = expand_nodelist(nodelist), per_node_counts(tasks)
    except ValueError as exc:
        raise UsageError(f"--hosts slurm: SLURM_JOB_NODELIST={nodelist!r}, SLURM_TASKS_PER_NODE={tasks!r}: "
                         f"{exc}") from None
    if len(nodes) != len(counts) or not all(_HOST_NAME.match(n) for n in nodes):
        raise UsageError(f"--hosts slurm: SLURM_JOB_NODELIST={nodelist!r} and SLURM_TASKS_PER_NODE={tasks!r} do "
                         f"not name one task count per node")
    shared = environ.get("LAB_SHARED_DIR") or None
    if shared is not None and not _PATH.match(shared):
        raise UsageError(f"LAB_SHARED_DIR={shared!r}: not an absolute path of plain characters")
    source = f"<slurm job {environ['SLURM_JOB_ID']}>"
    return Inventory(source, tuple(Host(node, node, connection="slurm", python=python, slots=count, source=source,
                                        shared_dir=shared) for node, count in zip(nodes, counts)))


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compact list of nodes as names: ``node[1-3,07],login`` -> node1, node2, node3,
    node07, login (ranges keep their zero padding; ValueError when it is not such a list)."""
    names: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(nodelist + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise ValueError("unbalanced brackets")
        if char == "," and depth == 0:
            names += _expand_name(nodelist[start:i])
            start = i + 1
    return names


def _expand_name(name: str) -> list[str]:
    """One item of a node list: a name, or a name with bracketed ranges (``gpu[1-2]-ib[0-1]``)."""
    head, bracket, rest = name.partition("[")
    if not bracket:
        if not name:
            raise ValueError("an empty name")
        return [name]
    inside, _, tail = rest.partition("]")
    tails = _expand_name(tail) if tail else [""]
    numbers: list[str] = []
    for part in inside.split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(last or first) < int(first):
            raise ValueError(f"not a range: {part!r}")
        numbers += [f"{n:0{len(first)}d}" for n in range(int(first), int(last or first) + 1)]
    return [f"{head}{number}{t}" for number in numbers for t in tails]


class _TooDeep(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, composing nodes (each alias one shared node) at most
    ``_MAX_YAML_DEPTH`` collections deep: its composer recurses once per level."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Node | None, index: object) -> Node | None:
        if self.depth >= _MAX_YAML_DEPTH:
            raise _TooDeep(self.peek_event().start_mark.line + 1)  # type: ignore[no-untyped-call]
        self.depth += 1
        try:
            return super().compose_node(parent, index)  # type: ignore[arg-type]
        finally:
            self.depth -= 1


def _compose(text: str, source: str) -> Node | None:
    try:
        return yaml.compose(text, Loader=_Loader)
    except _TooDeep as err:
        message = f"the YAML is nested more than {_MAX_YAML_DEPTH} levels deep"
        raise InventoryError(source, err.line, message) from None
    except RecursionError:
        raise InventoryError(source, None, "the YAML is nested too deep to read") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        message = ", ".join(part for part in (err.context, err.problem) if part)
        raise InventoryError(source, mark.line + 1 if mark else None, f"invalid YAML: {message}") from None
    except yaml.reader.ReaderError as err:
        line = text.count("\n", 0, err.position) + 1
        message = f"invalid YAML: unacceptable character #x{err.character:04x}"
        raise InventoryError(source, line, message) from None


# -- values ---------------------------------------------------------------------------


class _Invalid(Exception):
    """A variable's value is wrong; the parser adds the line."""


Reader = Callable[[str, Node, str], object]  # (key, value node, base dir) -> the Host field's value


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _NULL


def _one_line(text: str) -> str:
    """``text`` for a message: control characters and line breaks escaped, long text cut."""
    text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return text if len(text) <= 60 else text[:57] + "..."


def _shown(node: Node) -> str:
    """How a value reads in a message: one line, never a Python repr."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == _NULL and not node.value:
        return "nothing"
    text = _one_line(node.value)
    return f"'{text}'" if node.tag == _STR else text


def text_value(key: str, node: Node, base_dir: str) -> str:
    value = node.value.strip() if isinstance(node, ScalarNode) and node.tag not in (_NULL, _BOOL) else ""
    if not value or "\n" in value:
        raise _Invalid(f"{key} must be a one-line string, got {_shown(node)}")
    return value


def _host_directory(key: str, node: Node, base_dir: str) -> str:
    """An absolute directory on the host itself (not resolved here)."""
    value = text_value(key, node, base_dir)
    if not value.startswith("/"):
        raise _Invalid(f"{key} must be an absolute path on the host, got {_shown(node)}")
    if not _PATH.match(value):
        raise invalid_value(key, value, "an absolute path of letters, digits and '_', '.', '/', '+', '@', ',', '=', "
                                   "'-' only")
    return value.rstrip("/") or "/"


def integer(minimum: int, maximum: int | None = None) -> Reader:
    wanted = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def read(key: str, node: Node, base_dir: str) -> int:
        value = _INTS.construct_yaml_int(node) if isinstance(node, ScalarNode) and node.tag == _INT else None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            raise _Invalid(f"{key} must be {wanted}, got {_shown(node)}")
        return value

    return read


def _connection(key: str, node: Node, base_dir: str) -> str:
    value = text_value(key, node, base_dir)
    if value not in _CONNECTIONS:
        raise _Invalid(f"{key} must be one of {', '.join(_CONNECTIONS)}, got {_shown(node)}")
    return value


# Values that reach a host's command line or environment match these before they go anywhere.
_INTERFACE = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,14}\Z")  # Linux: < 16 bytes, no '/'
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*\.?\Z")
_LOGIN = re.compile(r"(?=.{1,32}\Z)[A-Za-z0-9_][A-Za-z0-9_.-]*\$?\Z")  # POSIX portable user names (and Samba's $)
_PATH = re.compile(r"/[A-Za-z0-9_./+@,=-]*\Z")
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")  # Docker's container names (and ids)
_COMMAND = re.compile(r"/[A-Za-z0-9_./+-]*\Z|[A-Za-z0-9_.+][A-Za-z0-9_.+-]*\Z")  # absolute path, or a bare name


def invalid_value(key: str, value: str, allowed: str) -> _Invalid:
    return _Invalid(f"invalid {key} '{_one_line(value)}' ({allowed})")


def _address(key: str, node: Node, base_dir: str) -> str:
    """An IPv4 or IPv6 address, or a DNS host name."""
    value = text_value(key, node, base_dir)
    try:
        ipaddress.ip_address(value)
        if _INTERFACE.match(value.partition("%")[2] or "lo"):  # (Python takes any scope: fe80::1%ANY)
            return value
    except ValueError:
        pass
    if not _HOST_NAME.match(value) or value.rstrip(".").replace(".", "").isdigit():  # (999.1.2.3: no address)
        raise invalid_value(key, value, "an IPv4 or IPv6 address, or a DNS host name: labels of letters, digits, "
                                        "'-' and '_' joined by dots")
    return value


def _matching(pattern: re.Pattern[str], allowed: str) -> Reader:
    """A reader of a string that must match ``pattern`` (``allowed`` says what that is)."""

    def read(key: str, node: Node, base_dir: str) -> str:
        value = text_value(key, node, base_dir)
        if not pattern.match(value):
            raise invalid_value(key, value, allowed)
        return value

    return read


_interface = _matching(_INTERFACE, "a network interface name: 1 to 15 of letters, digits, '_', '.', ':' and '-', "
                                   "not starting with '-'")
_login = _matching(_LOGIN, "a user name: up to 32 of letters, digits, '_', '.' and '-', not starting with '-', "
                           "perhaps ending in '$'")
_container = _matching(_CONTAINER, "a Docker container name or id: letters, digits, '_', '.' and '-', starting "
                                   "with a letter or digit")


def _python(key: str, node: Node, base_dir: str) -> str:
    value = text_value(key, node, base_dir)
    if value in _AUTO_PYTHON:
        return _DEFAULT_PYTHON
    if not _COMMAND.match(value):
        raise invalid_value(key, value, "an absolute path or a command name, of letters, digits and '_', '.', '/', "
                                        "'+', '-' only")
    return value


def _key_file(key: str, node: Node, base_dir: str) -> str:
    path = os.path.abspath(os.path.join(base_dir, os.path.expanduser(text_value(key, node, base_dir))))
    if not os.path.exists(path):
        raise _Invalid(f"{key}: {path} does not exist")
    if not os.path.isfile(path):
        raise _Invalid(f"{key}: {path} is not a file")
    status = os.stat(path)
    if status.st_uid == os.getuid() and status.st_mode & 0o077:  # as OpenSSH refuses it (sshkey_perm_ok)
        raise _Invalid(f"{key}: key file {path} has mode {stat.S_IMODE(status.st_mode):04o}; a private key "
                       f"must not be readable by others (chmod 600 {path})")
    return path


def _user_names(key: str, node: Node, base_dir: str) -> tuple[str, ...]:
    """A list of user names (a YAML sequence, or one string of names split by commas)."""
    if isinstance(node, SequenceNode):
        names = [text_value(key, item, base_dir) for item in node.value]
    else:
        names = [name.strip() for name in text_value(key, node, base_dir).split(",")]
    bad = next((name for name in names if not _LOGIN.match(name)), None)
    if not names or bad is not None:
        raise _Invalid(f"{key} must be a list of user names, got {_shown(node) if bad is None else repr(bad)}")
    if len(set(names)) != len(names):
        raise _Invalid(f"{key} names a user twice: {', '.join(names)}")
    return tuple(names)


def _known_hosts_file(key: str, node: Node, base_dir: str) -> str:
    """A known_hosts path; the file itself may be missing (--accept-new-host-keys creates it)."""
    path = os.path.abspath(os.path.join(base_dir, os.path.expanduser(text_value(key, node, base_dir))))
    if os.path.isdir(path):
        raise _Invalid(f"{key}: {path} is a directory, not a file")
    if not os.path.isdir(os.path.dirname(path)):
        raise _Invalid(f"{key}: directory {os.path.dirname(path)} does not exist")
    return path


# Each key a host or group may set: the Host field it fills, and how its value is read.
VARS: dict[str, tuple[str, Reader]] = {
    "ansible_host": ("address", _address),
    "ansible_port": ("port", integer(1, 65535)),
    "ansible_user": ("user", _login),
    "ansible_ssh_private_key_file": ("key_file", _key_file),
    "ssh_known_hosts_file": ("known_hosts", _known_hosts_file),
    "ansible_connection": ("connection", _connection),
    "ansible_python_interpreter": ("python", _python),
    "slots": ("slots", integer(1)),
    "gpus": ("gpus", integer(0)),
    "data_address": ("data_address", _address),
    "network_interface": ("network_interface", _interface),
    "shared_dir": ("shared_dir", _host_directory),
    "docker_container": ("container", _container),
    "grade_users": ("grade_users", _user_names),
    "machine": ("machine", _matching(_NAME, "a machine's name in machines.yaml")),
}


def _one_edit(a: str, b: str) -> bool:
    """Whether ``a`` becomes ``b`` by one insertion, deletion, substitution or swap of
    neighbours (or by case alone)."""
    a, b = a.lower(), b.lower()
    if a == b:
        return True
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    if len(long) - len(short) != 1:
        return False
    i = next((i for i in range(len(short)) if short[i] != long[i]), len(short))
    return short[i:] == long[i + 1:]


def _did_you_mean(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` is one edit away from, if any."""
    return next((word for word in known if word != name and _one_edit(name, word)), None)


# -- structure ------------------------------------------------------------------------


@dataclass
class _Entry:
    """A group or host as read so far."""

    line: int  # where it is defined, else where it first appears
    parents: dict[str, int] = field(default_factory=dict)  # group it is listed under -> line
    vars: dict[str, object] = field(default_factory=dict)  # Host field -> value, its own only
    node: Node | None = None  # the mapping that defines it, once read


_Pair = tuple[str, ScalarNode, Node]


class _Parser:
    def __init__(self, source: str, base_dir: str, table: Mapping[str, tuple[str, Reader]]) -> None:
        self.source = source
        self.base_dir = base_dir
        self.table = table
        self.groups: dict[str, _Entry] = {"all": _Entry(1)}
        self.hosts: dict[str, _Entry] = {}
        self.ignored: dict[str, None] = {}  # variables the lab does not use, in file order
        self.read_pairs: dict[int, tuple[Node, list[_Pair], int]] = {}  # id -> (mapping, entries, weight)
        self.merge_work = 0  # entries copied by merges so far

    def error(self, node: Node, message: str) -> InventoryError:
        return InventoryError(self.source, _line(node), message)

    def read(self, root: Node) -> None:
        if not isinstance(root, MappingNode):
            raise self.error(root, f"the inventory must be a mapping of groups such as all:, "
                                   f"got {_shown(root)}")
        for name, key, value in self.pairs(root, "the inventory"):
            if name in _GROUP_KEYS:
                raise self.error(key, f"'{name}' must be inside a group, e.g. under all:")
            self.read_group(key, value, None if name == "all" else "all", 1)

    def read_group(self, key: ScalarNode, value: Node, parent: str | None, level: int) -> None:
        if parent is not None and key.value == "all":
            raise self.error(key, "'all' contains every group; it cannot be a child group")
        entry = self.enter(self.groups, "group", key, value, parent)
        if entry is None:
            return
        name = key.value
        if level > _MAX_GROUP_DEPTH:
            raise self.error(key, f"groups are nested more than {_MAX_GROUP_DEPTH} deep here")
        for word, word_key, node in self.pairs(value, f"group '{name}'"):
            if word == "vars":
                entry.vars = self.read_vars(node, f"vars of group '{name}'")
            elif word == "hosts":
                for _, host_key, host_value in self.pairs(node, f"hosts of group '{name}'"):
                    self.read_host(host_key, host_value, name)
            elif word == "children":
                for _, child_key, child_value in self.pairs(node, f"children of group '{name}'"):
                    self.read_group(child_key, child_value, name, level + 1)
            else:
                near = _did_you_mean(word, _GROUP_KEYS)
                mean = f": did you mean '{near}'?" if near else ""
                hint = "; put variables under vars:" if word in self.table or word in _SYNONYMS else ""
                known = ", ".join(_GROUP_KEYS)
                raise self.error(word_key, f"unknown key '{_one_line(word)}'{mean} (known: {known}{hint})")

    def read_host(self, key: ScalarNode, value: Node, group: str) -> None:
        entry = self.enter(self.hosts, "host", key, value, group)
        if entry is not None:
            entry.vars = self.read_vars(value, f"host '{key.value}'")

    def enter(self, table: dict[str, _Entry], kind: str, key: ScalarNode, value: Node,
              parent: str | None) -> _Entry | None:
        """Note ``key`` listed under ``parent``; the entry if ``value`` defines it (first time)."""
        if key.tag == _BOOL:
            raise self.error(key, f"{kind} name {key.value} reads as a YAML boolean; quote it")
        if not _NAME.match(key.value):
            raise self.error(key, f"invalid {kind} name '{_one_line(key.value)}': "
                                  "use letters, digits, '.', '-' and '_'")
        entry = table.setdefault(key.value, _Entry(_line(key)))
        if parent is not None:
            entry.parents.setdefault(parent, _line(key))
        bare = _is_null(value) or (isinstance(value, MappingNode) and not value.value)
        if bare or entry.node is value:  # a reference, or the same mapping again through an alias
            return None
        if entry.node is not None:
            raise self.error(key, f"duplicate {kind} '{key.value}' (first defined at line {entry.line})")
        entry.node, entry.line = value, _line(key)
        return entry

    def read_vars(self, node: Node, what: str) -> dict[str, object]:
        """The variables the lab uses; any other is noted in ``ignored``, unless its name is
        one edit from one the lab uses (a typo is an error)."""
        values: dict[str, object] = {}
        written: dict[str, ScalarNode] = {}  # Host field -> the key that set it here
        for name, key, value in self.pairs(node, what):
            if name in _PASSWORDS:
                raise self.error(key, "password authentication is not supported; "
                                      "use ansible_ssh_private_key_file")
            if name in _GROUP_KEYS:
                raise self.error(key, f"'{name}' is not a variable of {what}: hosts, vars and children "
                                      "go right under a group")
            lab_name = _SYNONYMS.get(name, name)
            if name in self.ignored:
                continue
            if lab_name not in self.table:
                near = _did_you_mean(name, [*self.table, *_SYNONYMS])
                if near is not None:
                    raise self.error(key, f"unknown key '{_one_line(name)}': did you mean '{near}'?")
                self.ignored.setdefault(name)
                continue
            attribute, read = self.table[lab_name]
            if attribute in written:
                other = written[attribute]
                raise self.error(key, f"{name} and {other.value} (line {_line(other)}) set the same thing; "
                                      "keep one")
            written[attribute] = key
            try:
                values[attribute] = read(name, value, self.base_dir)
            except _Invalid as err:
                raise self.error(value, str(err)) from None
        return values

    def pairs(self, node: Node, what: str, merging: tuple[Node, ...] = ()) -> list[_Pair]:
        """A mapping's (name, key, value) entries; none for an empty value.

        Keys must be unique; ``<<`` merge keys bring in entries the mapping does not set. Each
        mapping is read once (an alias is the same node), and merges are bounded: by depth, by
        the entries one mapping brings in counted as often as they are merged (what a reader
        that copies merges would make: 8 mappings that each merge the one before ten times
        are 10**7 entries), and by the entries copied in all.
        """
        if _is_null(node):
            return []
        if not isinstance(node, MappingNode):
            raise self.error(node, f"{what} must be a mapping, got {_shown(node)}")
        if id(node) in self.read_pairs:
            return self.read_pairs[id(node)][1]
        if len(merging) > _MAX_MERGE_DEPTH:
            raise self.error(node, f"merges (<<) are nested more than {_MAX_MERGE_DEPTH} deep here")
        own: dict[str, tuple[ScalarNode, Node]] = {}
        merged: dict[str, tuple[ScalarNode, Node]] = {}
        weight = 0  # entries, each merged one as often as it is merged
        for key, value in node.value:
            if key.tag == _MERGE:
                for mapping in value.value if isinstance(value, SequenceNode) else [value]:
                    if mapping is node or any(mapping is outer for outer in merging):
                        raise self.error(mapping, "a merge (<<) cannot bring in the mapping it is part of")
                    entries = self.pairs(mapping, "a merge (<<) value", (*merging, node))
                    weight += self.read_pairs[id(mapping)][2] if entries else 0
                    self.merge_work += len(entries)
                    if weight > _MAX_MERGED or self.merge_work > _MAX_MERGE_WORK:
                        raise self.error(key, f"the merges (<<) here bring in more than {_MAX_MERGED:,} entries "
                                              "(each counted as often as it is merged): a merge bomb?"
                                         if weight > _MAX_MERGED else
                                         f"the merges (<<) of this file copy more than {_MAX_MERGE_WORK:,} "
                                         "entries in all")
                    for name, merged_key, merged_value in entries:
                        merged.setdefault(name, (merged_key, merged_value))
                continue
            if not isinstance(key, ScalarNode) or key.tag == _NULL:
                raise self.error(key, f"a key must be a name, got {_shown(key)}")
            if key.value in own:
                first = _line(own[key.value][0])
                raise self.error(key, f"duplicate key '{_one_line(key.value)}' (first at line {first})")
            own[key.value] = (key, value)
            weight += 1
        found = [(name, key, value) for name, (key, value) in {**merged, **own}.items()]
        self.read_pairs[id(node)] = (node, found, weight)
        return found

    def build(self) -> list[Entry]:
        depths: dict[str, int] = {}
        for name in self.groups:
            self.depth(name, depths, ())
        return [self.host(name, entry, depths) for name, entry in self.hosts.items()]

    def depth(self, name: str, depths: dict[str, int], below: tuple[str, ...]) -> int:
        """How far group ``name`` is from ``all``, by its longest path (Ansible's depth)."""
        if name not in depths:
            entry = self.groups[name]
            for parent, line in entry.parents.items():
                if parent == name:
                    raise InventoryError(self.source, line, f"group cycle: '{name}' is listed under itself")
                if parent in below:
                    message = f"group cycle: '{name}' is listed under '{parent}', which is under '{name}'"
                    raise InventoryError(self.source, line, message)
            if len(below) > _MAX_GROUP_DEPTH:  # (before the stack runs out)
                raise InventoryError(self.source, entry.line,
                                     f"groups are nested more than {_MAX_GROUP_DEPTH} deep here")
            parents = (self.depth(parent, depths, (*below, name)) for parent in entry.parents)
            depths[name] = 1 + max(parents, default=-1)
            if depths[name] > _MAX_GROUP_DEPTH:
                raise InventoryError(self.source, entry.line,
                                     f"groups are nested more than {_MAX_GROUP_DEPTH} deep here")
        return depths[name]

    def host(self, name: str, entry: _Entry, depths: dict[str, int]) -> Entry:
        groups = self.ancestors(entry)
        values: dict[str, object] = {}
        for group in sorted(groups, key=lambda group: (depths[group], group)):
            values.update(self.groups[group].vars)
        values.update(entry.vars)
        return (name, values, tuple(group for group in self.groups if group in groups and group != "all"),
                f"{self.source}:{entry.line}")

    def ancestors(self, entry: _Entry) -> set[str]:
        found: set[str] = set()
        todo = list(entry.parents)
        while todo:
            group = todo.pop()
            if group not in found:
                found.add(group)
                todo.extend(self.groups[group].parents)
        return found
