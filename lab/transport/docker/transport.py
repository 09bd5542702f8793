"""The docker transport: ranks are processes in a named container, started with ``docker exec -i``
(for containers without sshd; see ``lab.transport.prefixed``). Files go in through ``tar`` in the
container, which sees its tmpfs mounts, unlike the engine's archive API. The host keys it reads
(the container, the user) are declared in ``lab.transport.docker.keys``."""
from __future__ import annotations

import shutil

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from lab.errors import HostUnreachable, RunError
from lab.inventory.model import Host
from lab.transport.prefixed import PrefixedTransport

API_TIMEOUT = 30  # seconds for one engine call


class DockerTransport(PrefixedTransport):
    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.container_name = host.container or host.name
        self._container: Container | None = None

    def running(self) -> Container:
        """The running container (looked up once); HostUnreachable when it is not there."""
        if self._container is None:
            try:
                found = docker.from_env(version="auto", timeout=API_TIMEOUT).containers.get(self.container_name)
            except NotFound:
                raise HostUnreachable(
                    self.host.name, f"host {self.host.name}: no container {self.container_name}") from None
            except DockerException as exc:
                raise HostUnreachable(
                    self.host.name, f"host {self.host.name}: the Docker engine does not answer: {exc}") from None
            if found.status != "running":
                raise HostUnreachable(
                    self.host.name, f"host {self.host.name}: container {self.container_name} is {found.status}")
            self._container = found
        return self._container

    def prefix(self) -> list[str]:
        """``docker exec -i`` into the running container, as the inventory's user if it names one."""
        docker_cli = shutil.which("docker")
        if docker_cli is None:
            raise RunError(f"host {self.host.name}: the docker command is needed for ansible_connection docker")
        self.running()
        user = ["--user", self.host.user] if self.host.user else []
        return [docker_cli, "exec", "-i", *user, self.container_name]
