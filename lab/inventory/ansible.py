"""The Ansible-style YAML reader: the hosts of a file laid out as Ansible's YAML inventory, each
with the variables a table of keys reads (``lab.inventory.keys``: the field each fills and how its
value is read). The inventory (``lab.inventory.hosts``) and the machines file
(``lab.containerlab.machines``) are both read by it, each with its own table of keys.

The layout is Ansible's YAML inventory::

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

Variables the table does not name (an Ansible inventory's own: ``ntp_server``,
``ansible_become_user``...) are ignored, and logged once at INFO on the "lab.inventory"
logger (``-v``); a name one edit from one the table names (``slot``, ``ansible_hots``) is an
error that says which was meant. Ansible's older names (``SYNONYMS``) are read as the new ones,
and passwords are refused.

The file is read as a YAML node tree (``yaml.compose``), not as Python data, so
every error names its exact line and duplicate keys (which PyYAML silently
collapses) are caught. Aliases stay shared nodes, merges (``<<``) are read once per
mapping and bounded, and nesting is bounded, so no small file can take long or
exhaust the stack. Every problem raises ``InventoryError`` (``file:line: ...``).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from lab.errors import InventoryError
from lab.inventory.keys import BOOL_TAG, NAME, NULL_TAG, InvalidValue, Key, is_null, one_line, shown

_MERGE = "tag:yaml.org,2002:merge"

_GROUP_KEYS = ("hosts", "vars", "children")
_PASSWORDS = ("ansible_password", "ansible_ssh_pass")
# Ansible's older names, still read by its ssh connection: the lab reads them as the new ones.
SYNONYMS = {"ansible_ssh_host": "ansible_host", "ansible_ssh_port": "ansible_port",
            "ansible_ssh_user": "ansible_user", "ansible_private_key_file": "ansible_ssh_private_key_file"}
_MAX_YAML_DEPTH = 100  # nested YAML collections
_MAX_GROUP_DEPTH = 50  # groups under groups
_MAX_MERGE_DEPTH = 50  # mappings merged into mappings merged into...
_MAX_MERGED = 10_000  # entries one mapping's merges bring in, counted as often as they are merged
_MAX_MERGE_WORK = 1_000_000  # entries copied by every merge of the file
_log = logging.getLogger("lab.inventory")  # (the machines file's ignored variables are logged there too)

Entry = tuple[str, dict[str, object], tuple[str, ...], str]  # name, its variables, its groups, "file:line"


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


def read_ansible(text: str, source: str, base_dir: str, keys: Mapping[str, Key],
                 what: str = "the inventory") -> list[Entry]:
    """The hosts of an Ansible-style YAML file (``what`` names it in errors), each with the
    variables ``keys`` reads (name -> the field it fills and its reader; see
    ``lab.inventory.hosts.HOST_KEYS``), inherited through its groups; ``base_dir`` anchors
    relative paths."""
    root = _compose(text, source)
    if root is None or is_null(root):
        raise InventoryError(source, 1, f"{what} is empty")
    parser = _Parser(source, base_dir, keys)
    try:
        parser.read(root)
        hosts = parser.build()
    except RecursionError:  # (the bounds above come first; this is the last line of defence)
        raise InventoryError(source, None, f"{what} is nested too deep to read") from None
    if not hosts:
        raise InventoryError(source, _line(root), f"{what} defines no hosts")
    if parser.ignored:
        _log.info("%s: ignored variables the lab does not use: %s", source,
                  ", ".join(one_line(name) for name in parser.ignored))
    return hosts


# -- YAML -----------------------------------------------------------------------------


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


def _line(node: Node) -> int:
    return node.start_mark.line + 1


# -- near misses ----------------------------------------------------------------------


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
    vars: dict[str, object] = field(default_factory=dict)  # field -> value, its own only
    node: Node | None = None  # the mapping that defines it, once read


_Pair = tuple[str, ScalarNode, Node]


class _Parser:
    def __init__(self, source: str, base_dir: str, keys: Mapping[str, Key]) -> None:
        self.source = source
        self.base_dir = base_dir
        self.keys = keys
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
                                   f"got {shown(root)}")
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
                hint = "; put variables under vars:" if word in self.keys or word in SYNONYMS else ""
                known = ", ".join(_GROUP_KEYS)
                raise self.error(word_key, f"unknown key '{one_line(word)}'{mean} (known: {known}{hint})")

    def read_host(self, key: ScalarNode, value: Node, group: str) -> None:
        entry = self.enter(self.hosts, "host", key, value, group)
        if entry is not None:
            entry.vars = self.read_vars(value, f"host '{key.value}'")

    def enter(self, table: dict[str, _Entry], kind: str, key: ScalarNode, value: Node,
              parent: str | None) -> _Entry | None:
        """Note ``key`` listed under ``parent``; the entry if ``value`` defines it (first time)."""
        if key.tag == BOOL_TAG:
            raise self.error(key, f"{kind} name {key.value} reads as a YAML boolean; quote it")
        if not NAME.match(key.value):
            raise self.error(key, f"invalid {kind} name '{one_line(key.value)}': "
                                  "use letters, digits, '.', '-' and '_'")
        entry = table.setdefault(key.value, _Entry(_line(key)))
        if parent is not None:
            entry.parents.setdefault(parent, _line(key))
        bare = is_null(value) or (isinstance(value, MappingNode) and not value.value)
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
        written: dict[str, ScalarNode] = {}  # field -> the key that set it here
        for name, key, value in self.pairs(node, what):
            if name in _PASSWORDS:
                raise self.error(key, "password authentication is not supported; "
                                      "use ansible_ssh_private_key_file")
            if name in _GROUP_KEYS:
                raise self.error(key, f"'{name}' is not a variable of {what}: hosts, vars and children "
                                      "go right under a group")
            lab_name = SYNONYMS.get(name, name)
            if name in self.ignored:
                continue
            if lab_name not in self.keys:
                near = _did_you_mean(name, [*self.keys, *SYNONYMS])
                if near is not None:
                    raise self.error(key, f"unknown key '{one_line(name)}': did you mean '{near}'?")
                self.ignored.setdefault(name)
                continue
            wanted = self.keys[lab_name]
            if wanted.attribute in written:
                other = written[wanted.attribute]
                raise self.error(key, f"{name} and {other.value} (line {_line(other)}) set the same thing; "
                                      "keep one")
            written[wanted.attribute] = key
            try:
                values[wanted.attribute] = wanted.read(name, value, self.base_dir)
            except InvalidValue as err:
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
        if is_null(node):
            return []
        if not isinstance(node, MappingNode):
            raise self.error(node, f"{what} must be a mapping, got {shown(node)}")
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
            if not isinstance(key, ScalarNode) or key.tag == NULL_TAG:
                raise self.error(key, f"a key must be a name, got {shown(key)}")
            if key.value in own:
                first = _line(own[key.value][0])
                raise self.error(key, f"duplicate key '{one_line(key.value)}' (first at line {first})")
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
