"""The host keys the docker transport reads, declared beside it as pyinfra's connectors declare
their data: the container a ``docker`` host is, and the user ``docker exec`` runs as there (each
with the ``Host`` field it fills, how its value is read and checked, and what it means).

``ansible_user`` is the SSH transport's key too (``lab.transport.ssh.keys``), read the same way:
the inventory's table (``lab.inventory.hosts.HOST_KEYS``) holds it once, with both meanings.

Light on purpose (the inventory's vocabulary only, no Docker SDK), so that reading an inventory
does not load the SDK.
"""
from __future__ import annotations

from lab.inventory.keys import CONTAINER, Key, matching, user_name

_container = matching(CONTAINER, "a Docker container name or id: letters, digits, '_', '.' and '-', starting "
                                 "with a letter or digit")

DOCKER_KEYS: dict[str, Key] = {
    "ansible_user": Key("user", user_name, "on a `docker` host, the user `docker exec` runs as (default: the "
                                           "container's)"),
    "docker_container": Key("container", _container, "the container of a `docker` host (default: the host's name)"),
}
