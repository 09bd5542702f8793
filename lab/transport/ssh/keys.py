"""The host keys the SSH transport reads, declared beside it as pyinfra's connectors declare their
data: the port SSH reaches a host on, the user it logs in as, the private key it logs in with and
the known_hosts file that holds the host's key (each with the ``Host`` field it fills, how its value
is read and checked, and what it means).

The inventory's table (``lab.inventory.hosts.HOST_KEYS``) is made of these and the other
transports' declarations; the machines file's (``lab.containerlab.machines``) takes them as they
are, since a machine is logged in to over SSH as a lab host is. What the transport does with them
is in ``connections`` (the inventory's values win over ``~/.ssh/config``) and ``known_hosts``.

Light on purpose (the standard library and the inventory's vocabulary, no paramiko), so that
reading an inventory does not load the SSH client.
"""
from __future__ import annotations

import os
import stat

from yaml.nodes import Node

from lab.inventory.keys import InvalidValue, Key, integer, text_value, user_name


def _key_file(key: str, node: Node, base_dir: str) -> str:
    path = os.path.abspath(os.path.join(base_dir, os.path.expanduser(text_value(key, node, base_dir))))
    if not os.path.exists(path):
        raise InvalidValue(f"{key}: {path} does not exist")
    if not os.path.isfile(path):
        raise InvalidValue(f"{key}: {path} is not a file")
    status = os.stat(path)
    if status.st_uid == os.getuid() and status.st_mode & 0o077:  # as OpenSSH refuses it (sshkey_perm_ok)
        raise InvalidValue(f"{key}: key file {path} has mode {stat.S_IMODE(status.st_mode):04o}; a private key "
                           f"must not be readable by others (chmod 600 {path})")
    return path


def _known_hosts_file(key: str, node: Node, base_dir: str) -> str:
    """A known_hosts path; the file itself may be missing (--accept-new-host-keys creates it)."""
    path = os.path.abspath(os.path.join(base_dir, os.path.expanduser(text_value(key, node, base_dir))))
    if os.path.isdir(path):
        raise InvalidValue(f"{key}: {path} is a directory, not a file")
    if not os.path.isdir(os.path.dirname(path)):
        raise InvalidValue(f"{key}: directory {os.path.dirname(path)} does not exist")
    return path


# (Ansible's older names for the first three, lab.inventory.ansible.SYNONYMS, are read as these.)
SSH_KEYS: dict[str, Key] = {
    "ansible_port": Key("port", integer(1, 65535), "the port SSH reaches the host on (default 22)"),
    "ansible_user": Key("user", user_name, "the user SSH logs in as (default: `~/.ssh/config`'s User, else yours)"),
    "ansible_ssh_private_key_file": Key("key_file", _key_file, "the private key SSH logs in with (key-based auth "
                                                               "only), which others may not read; relative to the "
                                                               "file's directory"),
    "ssh_known_hosts_file": Key("known_hosts", _known_hosts_file, "a known_hosts file for the host's key, relative to "
                                                                  "the file's directory (`~/.ssh/known_hosts` is read "
                                                                  "too)"),
}
