"""How a host's variables are declared and their values read: a ``Key`` says which field a variable
fills, how its value is read and checked, and what it means; the readers here are what keys are
made of, with the strict patterns that the values the lab passes to hosts (addresses, user names,
interfaces, commands) must match.

Each transport declares the keys it reads with them, beside its own code (``lab.transport.ssh.keys``,
``lab.transport.docker.keys``), as pyinfra's connectors declare their data; the inventory's table
(``lab.inventory.hosts.HOST_KEYS``) is those declarations and its own keys, ``merged``; the machines
file's (``lab.containerlab.machines``) is made of them too. The Ansible-style reader
(``lab.inventory.ansible``) reads a file with such a table.

A reader is given the variable's name, its YAML node and the directory that relative paths start
from; it returns the field's value, or raises ``InvalidValue``, to which the reader of the file
adds the file and the line. Nothing here reads a file, and nothing here imports a transport.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

STR_TAG = "tag:yaml.org,2002:str"
INT_TAG = "tag:yaml.org,2002:int"
BOOL_TAG = "tag:yaml.org,2002:bool"
NULL_TAG = "tag:yaml.org,2002:null"
_INTS = yaml.constructor.SafeConstructor()

# Values that reach a host's command line or environment match these before they go anywhere.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")  # a host's or a group's name
INTERFACE = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,14}\Z")  # Linux: < 16 bytes, no '/'
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOST_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*\.?\Z")
USER_NAME = re.compile(r"(?=.{1,32}\Z)[A-Za-z0-9_][A-Za-z0-9_.-]*\$?\Z")  # POSIX portable user names (and Samba's $)
PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./+@,=-]*\Z")
CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")  # Docker's container names (and ids)
COMMAND = re.compile(r"/[A-Za-z0-9_./+-]*\Z|[A-Za-z0-9_.+][A-Za-z0-9_.+-]*\Z")  # absolute path, or a bare name


class InvalidValue(Exception):
    """A variable's value is wrong; the reader adds the file and the line."""


Reader = Callable[[str, Node, str], object]  # (key, value node, base dir) -> the field's value


@dataclass(frozen=True)
class Key:
    """A variable a host or a group may set: the field it fills, how its value is read and
    checked, and what it means (one line, for a person: the reference lists it)."""

    attribute: str
    read: Reader
    meaning: str


def merged(*tables: Mapping[str, Key]) -> dict[str, Key]:
    """The keys of ``tables`` in one table, each where it is first declared. A key that several
    tables declare (``ansible_user``: the SSH transport's login, the docker transport's user in the
    container) must fill the same field and be read by the same reader, or ValueError names it;
    its meaning is each declaration's, joined by "; "."""
    found: dict[str, Key] = {}
    for table in tables:
        for name, key in table.items():
            known = found.get(name)
            if known is None:
                found[name] = key
            elif (known.attribute, known.read) != (key.attribute, key.read):
                raise ValueError(f"{name} is declared twice, to fill {known.attribute} and {key.attribute} or with "
                                 "two readers: a key is read one way")
            else:
                found[name] = Key(key.attribute, key.read, f"{known.meaning}; {key.meaning}")
    return found


# -- nodes in messages ----------------------------------------------------------------


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == NULL_TAG


def one_line(text: str) -> str:
    """``text`` for a message: control characters and line breaks escaped, long text cut."""
    text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return text if len(text) <= 60 else text[:57] + "..."


def shown(node: Node) -> str:
    """How a value reads in a message: one line, never a Python repr."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == NULL_TAG and not node.value:
        return "nothing"
    text = one_line(node.value)
    return f"'{text}'" if node.tag == STR_TAG else text


# -- values ---------------------------------------------------------------------------


def invalid_value(key: str, value: str, allowed: str) -> InvalidValue:
    """The error for ``key``'s ``value``, saying what is ``allowed``."""
    return InvalidValue(f"invalid {key} '{one_line(value)}' ({allowed})")


def text_value(key: str, node: Node, base_dir: str) -> str:
    """A one-line string, stripped."""
    value = node.value.strip() if isinstance(node, ScalarNode) and node.tag not in (NULL_TAG, BOOL_TAG) else ""
    if not value or "\n" in value:
        raise InvalidValue(f"{key} must be a one-line string, got {shown(node)}")
    return value


def integer(minimum: int, maximum: int | None = None) -> Reader:
    """A reader of an integer from ``minimum`` (to ``maximum``)."""
    wanted = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def read(key: str, node: Node, base_dir: str) -> int:
        value = _INTS.construct_yaml_int(node) if isinstance(node, ScalarNode) and node.tag == INT_TAG else None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            raise InvalidValue(f"{key} must be {wanted}, got {shown(node)}")
        return value

    return read


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def boolean(key: str, node: Node, base_dir: str) -> bool:
    """A YAML boolean, or one of Ansible's words for one (yes/no, on/off, 1/0, in any case)."""
    plain = isinstance(node, ScalarNode) and node.tag in (BOOL_TAG, STR_TAG, INT_TAG)
    value = node.value.strip().lower() if plain else ""
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise InvalidValue(f"{key} must be true or false, got {shown(node)}")


def matching(pattern: re.Pattern[str], allowed: str) -> Reader:
    """A reader of a string that must match ``pattern`` (``allowed`` says what that is)."""

    def read(key: str, node: Node, base_dir: str) -> str:
        value = text_value(key, node, base_dir)
        if not pattern.match(value):
            raise invalid_value(key, value, allowed)
        return value

    return read


user_name = matching(USER_NAME, "a user name: up to 32 of letters, digits, '_', '.' and '-', not starting with "
                                "'-', perhaps ending in '$'")


def address(key: str, node: Node, base_dir: str) -> str:
    """An IPv4 or IPv6 address, or a DNS host name."""
    value = text_value(key, node, base_dir)
    try:
        ipaddress.ip_address(value)
        if INTERFACE.match(value.partition("%")[2] or "lo"):  # (Python takes any scope: fe80::1%ANY)
            return value
    except ValueError:
        pass
    if not HOST_NAME.match(value) or value.rstrip(".").replace(".", "").isdigit():  # (999.1.2.3: no address)
        raise invalid_value(key, value, "an IPv4 or IPv6 address, or a DNS host name: labels of letters, digits, "
                                        "'-' and '_' joined by dots")
    return value
