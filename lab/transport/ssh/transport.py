"""The SSH transport: ranks are processes on a host reached over SSH (paramiko).

Contracts:

- Constructing an :class:`SSHTransport` does no I/O. The first call that needs the host
  (``prepare``, ``start``) reads ``~/.ssh/config`` and connects; every wait on the network
  is bounded by ``SSHSettings.connect_timeout``.
- The inventory's explicit values (``config``) (``ansible_host``, a non-default ``ansible_port``,
  ``ansible_user``, the key file) win over ``~/.ssh/config``, which is looked up by the
  host's name and by its address (HostName, User, Port, IdentityFile, ProxyJump,
  HashKnownHosts).
- Host keys are checked (``known_hosts``) against the lab's known_hosts file (the host's own, else the
  settings') and ``~/.ssh/known_hosts``. An unknown key is refused unless
  ``accept_new_host_keys``, which appends it to the lab file; a changed key is always
  refused.
- Authentication is by key only (the inventory's key file or IdentityFile, else ssh-agent
  and the default keys), never by password.
- Every failure to reach the host is a :class:`HostUnreachable` with one line that names it.
- A rank is one exec channel. The remote shell prints its PID and execs the worker in its
  place; sshd starts every exec command in a new session, so that PID is the process
  group that ``signal`` and ``kill`` address. The channel's stdin stays open while the rank
  runs: the worker kills its own group when it closes (the controller went away).
"""
from __future__ import annotations

import getpass
import logging
import os
import posixpath
import shlex
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import paramiko

from lab.core.inventory import Host
from lab.errors import HostUnreachable, LabError, RunError
from lab.rank.protocol import PID_MARK
from lab.transport.base import (
    RankProcess,
    Transport,
    made_run_dir,
    make_run_dir_command,
    remote_command,
    removable,
)
from lab.transport.ssh.config import (
    Endpoint,
    identity_files,
    jumps_of,
    lookup,
    parse_jump,
    port_of,
    read_config,
)
from lab.transport.ssh.known_hosts import CheckHostKey, KnownHosts

log = logging.getLogger(__name__)
WIRE_LOG = f"{__name__}.paramiko"  # paramiko's own log lines for the lab's connections


def _only_when_verbose(record: logging.LogRecord) -> bool:
    """paramiko logs a failed handshake with a traceback at ERROR; the lab raises one line for
    it instead, so paramiko's lines show only when the lab logs at DEBUG (``-v``)."""
    return log.isEnabledFor(logging.DEBUG)


logging.getLogger(WIRE_LOG).addFilter(_only_when_verbose)

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
RANKS_PER_CONNECTION = 8  # sshd allows 10 sessions per connection (MaxSessions); keep two spare
MAX_JUMPS = 8  # ProxyJump hops before we call it a loop
LINES_BEFORE_PID = 100  # what a login script may print before the pid line


@dataclass(frozen=True)
class SSHSettings:
    """How every SSH host of a run is reached."""

    connect_timeout: float = 10.0  # seconds for any one wait: TCP, banner, auth, a channel, a reply
    accept_new_host_keys: bool = False  # trust and record a host key seen for the first time
    known_hosts: str | None = None  # the lab's known_hosts file; a host's own file wins
    ssh_config: str = "~/.ssh/config"




class SSHProcess(RankProcess):
    """A rank started on an exec channel; ``pgid`` is its remote process group."""

    def __init__(self, transport: SSHTransport, client: paramiko.SSHClient, channel: paramiko.Channel,
                 pgid: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self._transport = transport
        self._client = client
        self._channel = channel
        self.pgid = pgid
        self.stdin = cast(IO[bytes], channel.makefile_stdin("wb"))  # closing it sends EOF (shutdown_write)
        self.stdout, self.stderr = stdout, stderr
        self._released = False

    def poll(self) -> int | None:
        """The exit status; -1 when it ended without one (killed by a signal, connection lost)."""
        return self._channel.recv_exit_status() if self._channel.exit_status_ready() else None

    def signal(self, signum: int) -> None:
        if not self._released:
            self._transport.signal_group(self._client, self.pgid, signum)

    def kill(self) -> None:
        """SIGKILL the remote group, close stdin and the channel; never raises."""
        if self._released:
            return
        self._released = True
        try:
            self._transport.signal_group(self._client, self.pgid, signal.SIGKILL)
            self._channel.shutdown_write()
            self._channel.status_event.wait(self._transport.settings.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            log.debug("%s: closing rank pgid %s: %s", self._transport.host.name, self.pgid, exc)
        finally:
            self._channel.close()


class SSHTransport(Transport):
    """Reaches one host over SSH; see the module's contracts."""

    def __init__(self, host: Host, settings: SSHSettings = SSHSettings()) -> None:
        super().__init__(host)
        self.settings = settings
        self._config: paramiko.SSHConfig | None = None  # read at the first connection
        self._endpoint: Endpoint | None = None
        self._lock = threading.RLock()  # ranks of one host may be started from several threads
        self._clients: list[paramiko.SSHClient] = []  # [0]: files, signals; ranks fill each in turn
        self._ranks_on: list[int] = []  # rank channels started on each of _clients
        self._hop: paramiko.SSHClient | None = None  # the last jump host, shared by _clients
        self._jump_clients: list[paramiko.SSHClient] = []

    # -- the Transport interface ------------------------------------------------------

    def prepare(self, run_name: str, uploads: Mapping[str, Path]) -> str:
        """Make the run directory and the directories of the uploads in one command, then put
        every file over one SFTP session (closed again: it would hold a session slot)."""
        client = self._main()
        subdirs = [d for d in (posixpath.dirname(relative) for relative in uploads) if d]
        status, output = self.run(client, make_run_dir_command(run_name, subdirs))
        run_dir = made_run_dir(output)
        if status != 0 or run_dir is None:
            raise RunError(f"host {self.host.name}: cannot make the run directory {run_name} in its temp "
                           f"directory: {output.splitlines()[-1] if output else f'exit status {status}'}")
        self.run_dir = run_dir
        targets = {posixpath.join(run_dir, relative): source for relative, source in uploads.items()}
        with self._talking("uploading the lab's files"):
            sftp = client.open_sftp()
            try:
                sftp.get_channel().settimeout(self.settings.connect_timeout)  # type: ignore[union-attr]
                for target, source in targets.items():
                    try:
                        with sftp.open(target, "wb") as remote:
                            remote.set_pipelined(True)
                            remote.write(source.read_bytes())
                    except (TimeoutError, ConnectionError):
                        raise
                    except OSError as exc:  # a local file, or SFTP's answer (no such file, no space...)
                        raise RunError(f"host {self.host.name}: cannot upload {source} to {target}: "
                                       f"{exc.strerror or exc}") from None
            finally:
                sftp.close()
        return run_dir

    def cleanup(self, keep: bool = False, also: Sequence[str] = ()) -> None:
        """``rm -rf`` the run directory (if ``prepare`` made it) and ``also``; a failure is logged."""
        directories = removable([self.run_dir, *also]) if self.run_dir else []
        if keep or not directories:
            return
        try:
            status, output = self.run(self._main(), f"rm -rf -- {shlex.join(directories)}")
        except LabError as exc:
            log.warning("%s; %s is left on host %s", exc, " ".join(directories), self.host.name)
            return
        if status != 0:
            log.warning("host %s: cannot remove %s: %s", self.host.name, " ".join(directories), output)

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> RankProcess:
        """Start ``argv`` on its own channel and read its pid (= its process group)."""
        client = self._rank_client()
        command = remote_command(self.python, argv, env, cwd)
        with self._talking("starting a rank"):
            channel = self._session(client)
            channel.exec_command(command)
        stdout = cast(IO[bytes], channel.makefile("rb"))  # paramiko's files read like binary files
        stderr = cast(IO[bytes], channel.makefile_stderr("rb"))
        try:
            pgid = self._read_pid(channel, stdout, stderr, argv, cwd)
        except BaseException:
            channel.close()
            raise
        log.debug("host %s: started pgid %d: %s", self.host.name, pgid, command)
        return SSHProcess(self, client, channel, pgid, stdout, stderr)

    def own_address(self) -> str | None:
        """The host's address on the connection that reaches it: sshd's SSH_CONNECTION says
        "client port server port". The address peers use when the inventory gives none."""
        status, output = self.run(self._main(), "echo $SSH_CONNECTION")
        fields = output.split()
        return fields[2] if status == 0 and len(fields) == 4 else None

    def close(self) -> None:
        """Close every connection, the jump hosts' last; safe to call twice."""
        for client in (*self._clients, *reversed(self._jump_clients)):
            client.close()
        self._clients, self._ranks_on, self._jump_clients, self._hop = [], [], [], None

    # -- commands ---------------------------------------------------------------------

    def run(self, client: paramiko.SSHClient, command: str) -> tuple[int, str]:
        """Run a short ``command``: its exit status and its output (stdout and stderr, stripped)."""
        with self._talking(f"running {command.split()[0]}"):
            channel = self._session(client)
            try:
                channel.settimeout(self.settings.connect_timeout)
                channel.set_combine_stderr(True)
                channel.exec_command(command)
                output = channel.makefile("rb").read()
                if not channel.status_event.wait(self.settings.connect_timeout):
                    raise TimeoutError
                return channel.recv_exit_status(), output.decode("utf-8", "replace").strip()
            finally:
                channel.close()

    def signal_group(self, client: paramiko.SSHClient, pgid: int, signum: int) -> None:
        """Send ``signum`` to remote process group ``pgid``; no error if it is gone or unreachable."""
        name = signal.Signals(signum).name.removeprefix("SIG")
        try:
            status, output = self.run(client, f"kill -s {name} -- -{pgid}")
        except HostUnreachable as exc:
            log.warning("%s; cannot send SIG%s to its rank (pgid %d)", exc, name, pgid)
            return
        if status != 0:
            log.debug("host %s: kill -s %s -- -%d: %s", self.host.name, name, pgid, output)

    def _session(self, client: paramiko.SSHClient) -> paramiko.Channel:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise EOFError("the connection is closed")
        return transport.open_session(timeout=self.settings.connect_timeout)

    def _read_pid(self, channel: paramiko.Channel, stdout: IO[bytes], stderr: IO[bytes],
                  argv: Sequence[str], cwd: str) -> int:
        channel.settimeout(self.settings.connect_timeout)
        what = f"host {self.host.name}: cannot start {shlex.join(argv)} in {cwd}"
        try:
            for _ in range(LINES_BEFORE_PID):
                line = stdout.readline()
                if not line:
                    break
                if line.startswith(PID_MARK):
                    channel.settimeout(None)  # from now on the rank's streams wait as long as it runs
                    return int(line[len(PID_MARK):])
                log.debug("host %s: before the pid: %r", self.host.name, line)
            errors = stderr.read().decode("utf-8", "replace").strip().splitlines()
        except TimeoutError:
            raise RunError(f"{what}: no answer within {self.settings.connect_timeout:g}s") from None
        raise RunError(f"{what}: {errors[-1] if errors else 'the remote shell ended without starting it'}")

    @contextmanager
    def _talking(self, doing: str) -> Iterator[None]:
        """Turn a broken or silent connection into :class:`HostUnreachable`."""
        try:
            yield
        except TimeoutError:
            raise HostUnreachable(self.host.name, f"{self._where()}: no answer within "
                                                  f"{self.settings.connect_timeout:g}s "
                                  f"while {doing}") from None
        except (paramiko.SSHException, EOFError, ConnectionError) as exc:
            raise HostUnreachable(self.host.name, f"{self._where()}: SSH connection failed while {doing}: "
                                  f"{_reason(exc)}") from None

    def _where(self) -> str:
        return self._endpoint.where if self._endpoint else f"host {self.host.name}"

    # -- connections ------------------------------------------------------------------

    def _main(self) -> paramiko.SSHClient:
        """The first connection: files, commands, and the first ranks."""
        with self._lock:
            if not self._clients:
                self._clients.append(self._connect())
                self._ranks_on.append(0)
            return self._clients[0]

    def _rank_client(self) -> paramiko.SSHClient:
        """A connection with a free session slot for one more rank."""
        with self._lock:
            self._main()
            if self._ranks_on[-1] >= RANKS_PER_CONNECTION:
                self._clients.append(self._connect())
                self._ranks_on.append(0)
            self._ranks_on[-1] += 1
            return self._clients[-1]

    def _connect(self) -> paramiko.SSHClient:
        """A new logged-in connection to the host, through its jump hosts if any."""
        if self._config is None or self._endpoint is None:
            self._config = read_config(self.settings.ssh_config)
            self._endpoint = self._target(self._config)
        endpoint = self._endpoint
        if not endpoint.jumps:
            return self._login(endpoint, None)
        if self._hop is None:
            self._hop = self._reach(self._jump(self._config, endpoint.jumps), self._config, 1)
        return self._login(endpoint, self._tunnel(self._hop, endpoint))

    def _reach(self, endpoint: Endpoint, config: paramiko.SSHConfig, depth: int) -> paramiko.SSHClient:
        """A connection to jump host ``endpoint``, through the hops before it."""
        sock = None
        if endpoint.jumps:
            if depth >= MAX_JUMPS:
                raise HostUnreachable(endpoint.host, f"{endpoint.who}: more than {MAX_JUMPS} ProxyJump hops (a loop in "
                                      f"{self.settings.ssh_config}?)")
            sock = self._tunnel(self._reach(self._jump(config, endpoint.jumps), config, depth + 1), endpoint)
        client = self._login(endpoint, sock)
        self._jump_clients.append(client)
        return client

    def _tunnel(self, hop: paramiko.SSHClient, endpoint: Endpoint) -> paramiko.Channel:
        """A ``direct-tcpip`` channel from jump host ``hop`` to ``endpoint``."""
        transport = hop.get_transport()
        try:
            if transport is None or not transport.is_active():
                raise EOFError("the connection to the jump host is closed")
            return transport.open_channel("direct-tcpip", (endpoint.address, endpoint.port), ("127.0.0.1", 0),
                                          timeout=self.settings.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostUnreachable(endpoint.host, f"{endpoint.where}: the jump host cannot connect to it: "
                                  f"{_reason(exc)}") from None

    def _login(self, endpoint: Endpoint, sock: paramiko.Channel | None) -> paramiko.SSHClient:
        """Connect to ``endpoint``, check its host key and log in with a key."""
        timeout = self.settings.connect_timeout
        known = KnownHosts(self._known_hosts_files(), self.settings.accept_new_host_keys)
        client = paramiko.SSHClient()  # no host keys loaded: every key goes to CheckHostKey
        client.set_log_channel(WIRE_LOG)
        policy = CheckHostKey(known, endpoint)
        client.set_missing_host_key_policy(policy)
        log.debug("%s: connecting as %s%s", endpoint.where, endpoint.user, " through a jump host" if sock else "")
        started = time.monotonic()
        try:
            client.connect(endpoint.address, endpoint.port, username=endpoint.user,
                           key_filename=list(endpoint.key_files) or None,  # type: ignore[arg-type]
                           allow_agent=True, look_for_keys=not endpoint.key_files, sock=sock,
                           timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                           channel_timeout=timeout, transport_factory=known.transport_factory(endpoint))
        except BaseException as exc:
            client.close()
            silent = time.monotonic() - started >= timeout  # paramiko's errors for this vary
            raise _unreachable(endpoint, exc, timeout, authenticating=policy.accepted, silent=silent) from None
        return client

    # -- where the host is ------------------------------------------------------------

    def _known_hosts_files(self) -> tuple[str, ...]:
        """The lab's file first (new keys go there), then ~/.ssh/known_hosts."""
        lab = self.host.known_hosts or self.settings.known_hosts
        files = [os.path.expanduser(path) for path in (lab, DEFAULT_KNOWN_HOSTS) if path]
        return tuple(dict.fromkeys(files))

    def _target(self, config: paramiko.SSHConfig) -> Endpoint:
        """The host as the inventory names it, completed from the SSH config."""
        host = self.host
        options = lookup(config, host.name, host.address)
        explicit_address = host.address != host.name  # ansible_host given
        return Endpoint(
            host=host.name, who=f"host {host.name}",
            address=host.address if explicit_address else options.get("hostname", host.name),
            port=host.port if host.port != 22 else port_of(options, f"host {host.name}"),
            user=host.user or options.get("user") or getpass.getuser(),
            key_files=(host.key_file,) if host.key_file else identity_files(options),
            jumps=jumps_of(options, f"host {host.name}"),
            hash_known_hosts=options.get("hashknownhosts", "no").lower() == "yes")

    def _jump(self, config: paramiko.SSHConfig, jumps: tuple[str, ...]) -> Endpoint:
        """The last hop of ``jumps``; the hops before it lead there (else its own ProxyJump)."""
        *before, spec = jumps
        user, name, port = parse_jump(spec, f"host {self.host.name}")
        options = lookup(config, name, name)
        who = f"host {self.host.name}: jump host {spec}"
        own_keys = identity_files(options)
        return Endpoint(
            host=self.host.name, who=who, address=options.get("hostname", name),
            port=port or port_of(options, who),
            user=user or options.get("user") or getpass.getuser(),
            key_files=own_keys or ((self.host.key_file,) if self.host.key_file else ()),
            jumps=tuple(before) or jumps_of(options, who),
            hash_known_hosts=options.get("hashknownhosts", "no").lower() == "yes")


# -- commands and messages ------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ChannelException):
        return f"channel refused ({exc.text})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _unreachable(endpoint: Endpoint, exc: BaseException, timeout: float, authenticating: bool,
                 silent: bool) -> BaseException:
    """The one-line error for a failed login (a LabError, or the original exception)."""
    if isinstance(exc, LabError) or not isinstance(exc, Exception):
        return exc  # our host-key verdict, or KeyboardInterrupt
    if authenticating or isinstance(exc, paramiko.AuthenticationException):
        keys = ", ".join(endpoint.key_files) or "from ssh-agent or ~/.ssh"
        if isinstance(exc, paramiko.PasswordRequiredException):
            why = ": it needs a passphrase; add it to ssh-agent"
        elif isinstance(exc, paramiko.AuthenticationException):
            why = ""  # the server said no
        else:  # an unreadable key, no key at all, a timeout
            why = f": {_reason(exc)}"
        return HostUnreachable(endpoint.host, f"{endpoint.who}: SSH authentication failed for user {endpoint.user} "
                               f"(key {keys}){why}")
    if isinstance(exc, socket.gaierror):
        reason = f"cannot resolve {endpoint.address}: {exc.strerror}"
    elif isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reason = "; ".join(sorted({_reason(e) for e in exc.errors.values()}))
    elif isinstance(exc, TimeoutError):
        reason = f"no answer within {timeout:g}s"
    elif silent:
        reason = f"no answer within {timeout:g}s ({_reason(exc)})"
    elif isinstance(exc, paramiko.SSHException):
        reason = f"SSH handshake failed: {_reason(exc)}"
    else:
        reason = _reason(exc)
    return HostUnreachable(endpoint.host, f"{endpoint.where}: cannot connect: {reason}")
