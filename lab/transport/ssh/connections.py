"""A host's SSH connections, as the SSH transport holds them: the first carries files, commands
and the first ranks, and each RANKS_PER_CONNECTION ranks more open one more (sshd allows 10
sessions on a connection).

Every connection logs in to the host as the inventory and ``~/.ssh/config`` name it (see
``lab.transport.ssh.transport``'s contracts): through its ProxyJump hosts (one chain, shared by
all its connections), its host key checked (``known_hosts``), by key only. Each asks the host
for an answer every ``SSHSettings.keepalive`` seconds (``keepalive@openssh.com`` with want-reply,
as OpenSSH's ServerAliveInterval does), so the transport can tell a host that went silent.
"""
from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
import time

import paramiko

from lab.errors import HostUnreachable, LabError
from lab.inventory.model import Host
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
from lab.transport.ssh.settings import WIRE_LOG, SSHSettings

log = logging.getLogger(__name__)
assert f"{__name__}.paramiko" == WIRE_LOG  # (paramiko's lines for the lab's connections log below this module's)


def _only_when_verbose(record: logging.LogRecord) -> bool:
    """paramiko logs a failed handshake with a traceback at ERROR; the lab raises one line for
    it instead, so paramiko's lines show only when the lab logs at DEBUG (``-v``); and never the
    two lines of every keepalive (its request, the server's "denied")."""
    if not log.isEnabledFor(logging.DEBUG):
        return False
    message = record.getMessage()
    return KEEPALIVE_REQUEST not in message and message != "Global request denied."


logging.getLogger(WIRE_LOG).addFilter(_only_when_verbose)

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
RANKS_PER_CONNECTION = 8  # sshd allows 10 sessions per connection (MaxSessions); keep two spare
MAX_JUMPS = 8  # ProxyJump hops before we call it a loop
BANNER_MAX = 4096  # bytes read for an SSH server's banner, at most (lines may come before it: RFC 4253, 4.2)
KEEPALIVE_REQUEST = "keepalive@openssh.com"  # OpenSSH's own: any server answers it (with "failure")


class _Keepalive:
    """Asks the host for an answer every ``interval`` seconds on one connection, from a thread of
    its own (paramiko's ``set_keepalive`` asks for no answer, so it cannot tell a silent peer)."""

    def __init__(self, transport: paramiko.Transport, interval: float, name: str) -> None:
        self._transport = transport
        self._interval = interval
        self._asked_at: float | None = None  # when the keepalive still unanswered was sent
        self.answered: float = time.monotonic()  # when the last keepalive answered was sent (at first: connected)
        self._stopped = threading.Event()
        threading.Thread(target=self._run, name=f"lab-ssh-keepalive-{name}", daemon=True).start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval) and self._transport.is_active():
            self._asked_at = time.monotonic()
            try:  # (returns when the answer came, or when the connection closed)
                self._transport.global_request(KEEPALIVE_REQUEST, wait=True)
            except (paramiko.SSHException, OSError, EOFError):
                return  # it cannot even be asked: the question stays unanswered
            if self._transport.is_active():
                self.answered, self._asked_at = self._asked_at, None

    def silent_for(self, now: float) -> float:
        """How long the host has left a keepalive unanswered on this connection (0 when none is
        waiting, or the connection is closed: that is no silence)."""
        asked = self._asked_at
        return 0.0 if asked is None or not self._transport.is_active() else now - asked

    def stop(self) -> None:
        self._stopped.set()


def is_up(client: paramiko.SSHClient, settle: float = 0.0) -> bool:
    """Whether ``client``'s connection is up; ``settle``: seconds a dropped one may take to be
    marked so."""
    transport = client.get_transport()
    if transport is not None and transport.is_active() and settle:
        transport.join(settle)  # (a dropped connection's thread ends within it)
    return transport is not None and transport.is_active()


class Connections:
    """One host's connections, made when first asked for (``who`` names the host in messages)."""

    def __init__(self, host: Host, settings: SSHSettings, who: str) -> None:
        self.host = host
        self.settings = settings
        self.who = who
        self._config: paramiko.SSHConfig | None = None  # read at the first connection
        self._endpoint: Endpoint | None = None
        self._lock = threading.RLock()  # ranks of one host may be started from several threads
        self._clients: list[paramiko.SSHClient] = []  # [0]: files, signals; ranks fill each in turn
        self._ranks_on: list[int] = []  # rank channels started on each of _clients
        self._hop: paramiko.SSHClient | None = None  # the last jump host, shared by _clients
        self._jump_clients: list[paramiko.SSHClient] = []
        self._keepalives: list[_Keepalive] = []  # one per connection, the jump hosts' too

    @property
    def first(self) -> paramiko.SSHClient | None:
        """The first connection, if it is made."""
        return self._clients[0] if self._clients else None

    @property
    def where(self) -> str:
        """How messages name the host: with its address and port once it was looked up."""
        return self._endpoint.where if self._endpoint else self.who

    def main(self) -> paramiko.SSHClient:
        """The first connection (made now if it is not yet): files, commands, and the first ranks."""
        with self._lock:
            if not self._clients:
                self._clients.append(self._connect())
                self._ranks_on.append(0)
            return self._clients[0]

    def for_rank(self) -> paramiko.SSHClient:
        """A connection with a free session slot for one more rank."""
        with self._lock:
            self.main()
            if self._ranks_on[-1] >= RANKS_PER_CONNECTION:
                self._clients.append(self._connect())
                self._ranks_on.append(0)
            self._ranks_on[-1] += 1
            return self._clients[-1]

    def silent_for(self, now: float) -> float:
        """The longest a keepalive has gone unanswered on any of the connections, the jump hosts' too."""
        return max((k.silent_for(now) for k in list(self._keepalives)), default=0.0)

    def answered_since(self, since: float) -> bool:
        """Whether every connection answered a keepalive sent after ``since``, the jump hosts' too."""
        return all(k.answered > since for k in list(self._keepalives))

    def all_up(self, settle: float = 0.0) -> bool:
        """Whether every connection to the host is up (see ``is_up``)."""
        return all(is_up(c, settle) for c in list(self._clients))

    def no_answer(self) -> str:
        """Why the host's SSH server does not answer a new connection with its banner ("" where it
        does): a host whose connections were closed from its end, yet whose sshd answers, is up; what
        closed them ran there (its user's processes: those a rank may signal, ``kill(-1)``, which may
        end every new login of that user too, where no banner is theirs to end)."""
        endpoint = self._endpoint
        if endpoint is None:
            return "it was never connected"
        timeout = self.settings.connect_timeout
        try:
            if not endpoint.jumps:
                sock: socket.socket | paramiko.Channel = socket.create_connection(
                    (endpoint.address, endpoint.port), timeout=timeout)
            elif self._hop is not None and is_up(self._hop):
                sock = self._tunnel(self._hop, endpoint)
            else:
                return "the connection to its jump host is closed"
        except HostUnreachable as exc:
            return str(exc).removeprefix(f"{endpoint.where}: ")
        except OSError as exc:
            return f"cannot connect: {reason(exc)}"
        try:
            sock.settimeout(timeout)
            banner = _has_banner(sock)
        except TimeoutError:
            return f"no SSH banner within {timeout:g}s"
        except OSError as exc:
            return f"no SSH banner: {reason(exc)}"
        finally:
            sock.close()
        return "" if banner else "no SSH banner (the connection closed, or said something else)"

    def cut(self) -> None:
        """Close every connection, the jump hosts' too, for a host that is lost: every read and
        every wait on them ends (a silent TCP connection would never end by itself)."""
        with self._lock:
            for client in (*self._clients, *self._jump_clients):
                client.close()

    def close(self) -> None:
        """Close every connection, the jump hosts' last, and forget them; safe to call twice."""
        for keepalive in self._keepalives:
            keepalive.stop()
        for client in (*self._clients, *reversed(self._jump_clients)):
            client.close()
        self._clients, self._ranks_on, self._jump_clients, self._hop = [], [], [], None
        self._keepalives = []

    # -- logging in -------------------------------------------------------------------

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
                                  f"{reason(exc)}") from None

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
        transport = client.get_transport()
        if transport is not None:
            self._keepalives.append(_Keepalive(transport, self.settings.keepalive, endpoint.host))
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
            host=host.name, who=self.who,
            address=host.address if explicit_address else options.get("hostname", host.name),
            port=host.port if host.port != 22 else port_of(options, self.who),
            user=host.user or options.get("user") or getpass.getuser(),
            key_files=(host.key_file,) if host.key_file else identity_files(options),
            jumps=jumps_of(options, self.who),
            hash_known_hosts=options.get("hashknownhosts", "no").lower() == "yes")

    def _jump(self, config: paramiko.SSHConfig, jumps: tuple[str, ...]) -> Endpoint:
        """The last hop of ``jumps``; the hops before it lead there (else its own ProxyJump)."""
        *before, spec = jumps
        user, name, port = parse_jump(spec, self.who)
        options = lookup(config, name, name)
        who = f"{self.who}: jump host {spec}"
        own_keys = identity_files(options)
        return Endpoint(
            host=self.host.name, who=who, address=options.get("hostname", name),
            port=port or port_of(options, who),
            user=user or options.get("user") or getpass.getuser(),
            key_files=own_keys or ((self.host.key_file,) if self.host.key_file else ()),
            jumps=tuple(before) or jumps_of(options, who),
            hash_known_hosts=options.get("hashknownhosts", "no").lower() == "yes")


def _has_banner(sock: socket.socket | paramiko.Channel) -> bool:
    """Whether what the server says first holds an SSH version line (``SSH-2.0-...``; other lines may
    come before it: RFC 4253, 4.2), read until it does, the connection ends or BANNER_MAX bytes."""
    said = b""
    while len(said) < BANNER_MAX:
        data = sock.recv(BANNER_MAX - len(said))
        if not data:
            break
        said += data
        if any(line.startswith(b"SSH-") for line in said.split(b"\n")[:-1]):
            return True
    return False


# -- messages -------------------------------------------------------------------------


def reason(exc: BaseException) -> str:
    """Why an SSH or socket call failed, in a few words."""
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
            why = f": {reason(exc)}"
        return HostUnreachable(endpoint.host, f"{endpoint.who}: SSH authentication failed for user {endpoint.user} "
                               f"(key {keys}){why}")
    if isinstance(exc, socket.gaierror):
        cause = f"cannot resolve {endpoint.address}: {exc.strerror}"
    elif isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        cause = "; ".join(sorted({reason(e) for e in exc.errors.values()}))
    elif isinstance(exc, TimeoutError):
        cause = f"no answer within {timeout:g}s"
    elif silent:
        cause = f"no answer within {timeout:g}s ({reason(exc)})"
    elif isinstance(exc, paramiko.SSHException):
        cause = f"SSH handshake failed: {reason(exc)}"
    else:
        cause = reason(exc)
    return HostUnreachable(endpoint.host, f"{endpoint.where}: cannot connect: {cause}")
