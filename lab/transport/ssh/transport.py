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
  ``kill_all`` kills many ranks of a host with one ``kill`` command (one session, whatever
  sshd's MaxSessions), and no group is signalled once its exit status is in.
- Every connection asks the host for an answer every ``SSHSettings.keepalive`` seconds (the
  global request ``keepalive@openssh.com`` with want-reply, as OpenSSH's ServerAliveInterval
  does). A host that leaves one unanswered for ``SSHSettings.alive_timeout`` seconds is lost:
  ``poll`` raises :class:`HostUnreachable` (one line that names it), and its connections are
  closed, so that every read and wait on them ends.
- Files go over SFTP; a host whose sshd offers no SFTP subsystem gets them as a tar stream on
  an exec channel (``tar -x`` there). The log (``-v``) says which.
"""
from __future__ import annotations

import contextlib
import getpass
import io
import logging
import os
import posixpath
import shlex
import signal
import socket
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import paramiko

from lab.errors import HostUnreachable, LabError, RunError
from lab.inventory import Host
from lab.rank.protocol import PID_MARK
from lab.transport.base import (
    RankProcess,
    Transport,
    kill_command,
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
    it instead, so paramiko's lines show only when the lab logs at DEBUG (``-v``); and never the
    two lines of every keepalive (its request, the server's "denied")."""
    if not log.isEnabledFor(logging.DEBUG):
        return False
    message = record.getMessage()
    return KEEPALIVE_REQUEST not in message and message != "Global request denied."


logging.getLogger(WIRE_LOG).addFilter(_only_when_verbose)

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
RANKS_PER_CONNECTION = 8  # sshd allows 10 sessions per connection (MaxSessions); keep two spare
COMMANDS_PER_CONNECTION = 2  # short commands (kill, rm, an upload) at once on one connection: the spare sessions
MAX_JUMPS = 8  # ProxyJump hops before we call it a loop
SETTLE = 0.05  # seconds paramiko may take to mark a dropped connection inactive after its channels closed
KEEPALIVE_REQUEST = "keepalive@openssh.com"  # OpenSSH's own: any server answers it (with "failure")
LINES_BEFORE_PID = 100  # what a login script may print before the pid line


@dataclass(frozen=True)
class SSHSettings:
    """How every SSH host of a run is reached."""

    connect_timeout: float = 10.0  # seconds for any one wait: TCP, banner, auth, a channel, a reply
    keepalive: float = 5.0  # seconds between two keepalives on every connection
    alive_timeout: float = 30.0  # seconds a keepalive may go unanswered before the host is lost
    accept_new_host_keys: bool = False  # trust and record a host key seen for the first time
    known_hosts: str | None = None  # the lab's known_hosts file; a host's own file wins
    ssh_config: str = "~/.ssh/config"




class _Keepalive:
    """Asks the host for an answer every ``interval`` seconds on one connection, from a thread of
    its own (paramiko's ``set_keepalive`` asks for no answer, so it cannot tell a silent peer)."""

    def __init__(self, transport: paramiko.Transport, interval: float, name: str) -> None:
        self._transport = transport
        self._interval = interval
        self._asked_at: float | None = None  # when the keepalive still unanswered was sent
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
                self._asked_at = None

    def silent_for(self, now: float) -> float:
        """How long the host has left a keepalive unanswered on this connection (0 when none is
        waiting, or the connection is closed: that is no silence)."""
        asked = self._asked_at
        return 0.0 if asked is None or not self._transport.is_active() else now - asked

    def stop(self) -> None:
        self._stopped.set()


class _QuietFinalizer:
    """A paramiko channel file whose finalizer never complains. paramiko's (``BufferedFile.__del__``)
    flushes the file again, even when it is closed; when the garbage collector finalized the
    file's write buffer first (a reference cycle, the end of the interpreter), that printed
    "Exception ignored in BufferedFile.__del__ ... ValueError: I/O operation on closed file"."""

    _closed: bool

    def __del__(self) -> None:
        if not self._closed:
            with contextlib.suppress(Exception):
                self.close()  # type: ignore[attr-defined]


class _StdoutFile(_QuietFinalizer, paramiko.ChannelFile):
    pass


class _StderrFile(_QuietFinalizer, paramiko.channel.ChannelStderrFile):
    pass


class _StdinFile(_QuietFinalizer, paramiko.channel.ChannelStdinFile):  # closing it sends EOF (shutdown_write)
    pass


def _close_file(file: IO[bytes]) -> None:
    try:
        file.close()
    except (OSError, EOFError, ValueError, paramiko.SSHException) as exc:
        log.debug("closing a channel file: %s", exc)


class SSHProcess(RankProcess):
    """A rank started on an exec channel; ``pgid`` is its remote process group."""

    def __init__(self, transport: SSHTransport, client: paramiko.SSHClient, channel: paramiko.Channel,
                 pgid: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self._transport = transport
        self._client = client
        self._channel = channel
        self.pgid = pgid
        self.stdin = cast(IO[bytes], _StdinFile(channel, "wb"))
        self.stdout, self.stderr = stdout, stderr
        self._released = False

    def poll(self) -> int | None:
        """The exit status; -1 when it ended without one (killed by a signal, connection closed).
        HostUnreachable when its host went silent before it said how it ended (see the module)."""
        ready = self._channel.exit_status_ready()
        if not self._released and not (ready and self._channel.exit_status != -1):
            self._transport.check_alive(ended=ready)
        return self._channel.recv_exit_status() if ready else None

    def exited(self) -> bool:
        return self._channel.exit_status_ready()  # (or its channel closed: nothing can reach it through it)

    def signal(self, signum: int) -> None:
        if not self._released and not self.exited():
            self._transport.signal_groups([self.pgid], signum, self._client)

    def kill(self) -> None:
        """SIGKILL the remote group (unless it exited), close stdin and the channel; never raises."""
        self._transport.kill_all([self])

    def release(self) -> None:
        self.release_by(time.monotonic() + self._transport.settings.connect_timeout)

    def release_by(self, deadline: float) -> None:
        """Send EOF, wait until ``deadline`` for its exit status (unless its host is lost), then close
        its files (stdin, stdout, stderr) and its channel, in that order; never raises."""
        if self._released:
            return
        self._released = True
        try:
            _close_file(self.stdin)  # EOF: a worker that is still there stops itself
            if not self._transport.is_lost:
                self._channel.status_event.wait(max(0.0, deadline - time.monotonic()))
        finally:
            _close_file(self.stdout)
            _close_file(self.stderr)
            self._channel.close()


class SSHTransport(Transport):
    """Reaches one host over SSH; see the module's contracts."""

    def __init__(self, host: Host, settings: SSHSettings = SSHSettings(), what: str = "host") -> None:
        super().__init__(host)
        self.settings = settings
        # how messages name it: a lab host (and the Docker machine it is on), or a Docker machine
        self.who = f"{what} {host.name}" + (f" on machine {host.machine}" if host.machine else "")
        self._config: paramiko.SSHConfig | None = None  # read at the first connection
        self._endpoint: Endpoint | None = None
        self._lock = threading.RLock()  # ranks of one host may be started from several threads
        self._clients: list[paramiko.SSHClient] = []  # [0]: files, signals; ranks fill each in turn
        self._ranks_on: list[int] = []  # rank channels started on each of _clients
        self._hop: paramiko.SSHClient | None = None  # the last jump host, shared by _clients
        self._jump_clients: list[paramiko.SSHClient] = []
        self._keepalives: list[_Keepalive] = []  # one per connection, the jump hosts' too
        self._lost: str | None = None  # why the host is lost (it went silent), once it is
        self._commands = threading.BoundedSemaphore(COMMANDS_PER_CONNECTION)

    # -- the Transport interface ------------------------------------------------------

    def prepare(self, run_name: str, uploads: Mapping[str, Path]) -> str:
        """Make the run directory and the directories of the uploads in one command, then put
        every file there in one more: a tar stream into ``tar -x`` on the host. A host without a
        working tar gets them over one SFTP session instead (closed again: it would hold a
        session slot), a round trip or more per file."""
        client = self._main()
        subdirs = [d for d in (posixpath.dirname(relative) for relative in uploads) if d]
        status, output = self.run(client, make_run_dir_command(run_name, subdirs))
        run_dir = made_run_dir(output)
        if status != 0 or run_dir is None:
            raise RunError(f"{self.who}: cannot make the run directory {run_name} in its temp "
                           f"directory: {output.splitlines()[-1] if output else f'exit status {status}'}")
        self.run_dir = run_dir
        with self._talking("uploading the lab's files"):
            untarred = self._untar(client, run_dir, uploads)
            if untarred is not None:
                log.info("host %s: tar cannot unpack the run's files (%s): %d files go over SFTP",
                         self.host.name, untarred, len(uploads))
                self._put_over_sftp(client, run_dir, uploads)
        return run_dir

    def _put_over_sftp(self, client: paramiko.SSHClient, run_dir: str, uploads: Mapping[str, Path]) -> None:
        try:
            sftp = client.open_sftp()
        except (paramiko.SSHException, EOFError) as exc:  # no SFTP subsystem: "Channel closed."
            if not self._reaches(client):
                raise
            raise RunError(f"{self.who}: cannot copy the run's files: its tar failed and it has no "
                           f"SFTP ({_reason(exc)})") from None
        try:
            sftp.get_channel().settimeout(self.settings.connect_timeout)  # type: ignore[union-attr]
            for relative, source in uploads.items():
                target = posixpath.join(run_dir, relative)
                try:
                    with sftp.open(target, "wb") as remote:
                        remote.set_pipelined(True)
                        remote.write(source.read_bytes())
                except (TimeoutError, ConnectionError):
                    raise
                except OSError as exc:  # a local file, or SFTP's answer (no such file, no space...)
                    raise RunError(f"{self.who}: cannot upload {source} to {target}: "
                                   f"{exc.strerror or exc}") from None
        finally:
            sftp.close()

    def _untar(self, client: paramiko.SSHClient, run_dir: str, uploads: Mapping[str, Path]) -> str | None:
        """Put the uploads in ``run_dir`` with ``tar -x`` on the host, fed a tar stream built here;
        None when it did, else what tar said."""
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for relative, source in uploads.items():
                try:
                    data = source.read_bytes()
                except OSError as exc:
                    raise RunError(f"{self.who}: cannot upload {source} to "
                                   f"{posixpath.join(run_dir, relative)}: {exc.strerror or exc}") from None
                info = tarfile.TarInfo(relative)
                info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        untar = shlex.join(["tar", "-x", "-f", "-", "--no-same-owner", "-C", run_dir])
        status, output = self.run(client, f"/bin/sh -c {shlex.quote(untar)}", archive.getvalue())
        if status != 0:
            return output.splitlines()[-1] if output else f"exit status {status}"
        return None

    @staticmethod
    def _reaches(client: paramiko.SSHClient, settle: float = 0.0) -> bool:
        transport = client.get_transport()
        if transport is not None and transport.is_active() and settle:
            transport.join(settle)  # (a dropped connection's thread ends within it)
        return transport is not None and transport.is_active()

    def cleanup(self, keep: bool = False, also: Sequence[str] = ()) -> None:
        """``rm -rf`` the run directory (if ``prepare`` made it) and ``also``; a failure is logged."""
        directories = removable([self.run_dir, *also]) if self.run_dir else []
        if keep or not directories:
            return
        if self.is_lost or (self._clients and not self._reaches(self._clients[0])):
            log.debug("%s: gone; %s is left there", self._where(), " ".join(directories))
            return  # (the run's error names the host; its files went down with it)
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
        stdout = cast(IO[bytes], _StdoutFile(channel, "rb"))  # paramiko's files read like binary files
        stderr = cast(IO[bytes], _StderrFile(channel, "rb"))
        try:
            pgid = self._read_pid(channel, stdout, stderr, argv, cwd)
        except BaseException:
            _close_file(stdout)
            _close_file(stderr)
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
        for keepalive in self._keepalives:
            keepalive.stop()
        for client in (*self._clients, *reversed(self._jump_clients)):
            client.close()
        self._clients, self._ranks_on, self._jump_clients, self._hop = [], [], [], None
        self._keepalives = []

    # -- liveness ---------------------------------------------------------------------

    @property
    def is_lost(self) -> bool:
        return self._lost is not None

    def reaches(self) -> bool:
        """Whether the host's first connection is made and still up."""
        return bool(self._clients) and self._reaches(self._clients[0])

    def check_alive(self, ended: bool = False) -> None:
        """Raise HostUnreachable when the host is lost: a keepalive on one of its connections went
        unanswered for ``alive_timeout`` seconds, or one of its connections was closed from the
        other end (the host, or its machine, went down). Its connections are then closed, so that
        every read and every wait on them ends (a silent TCP connection would never end by itself).
        ``ended``: a rank's channel closed without an exit status, which is how paramiko shows a
        dropped connection a moment before it marks the connection inactive (SETTLE waits for it)."""
        if self._lost is None:
            now = time.monotonic()
            silent = max((k.silent_for(now) for k in list(self._keepalives)), default=0.0)
            closed = not all(self._reaches(c, settle=SETTLE if ended else 0.0) for c in list(self._clients))
            if silent < self.settings.alive_timeout and not closed:
                return
            with self._lock:
                if self._lost is None:
                    self._lost = (f"{self._where()}: lost: " + (
                        f"no answer to SSH keepalives for {silent:.0f}s (the host or the network went silent)"
                        if silent >= self.settings.alive_timeout else
                        "its SSH connection was closed from the other end (the host went down, or its sshd)"))
                    log.debug("%s; closing its connections", self._lost)
                    for client in (*self._clients, *self._jump_clients):
                        client.close()
        raise HostUnreachable(self.host.name, self._lost)

    def kill_all(self, processes: Sequence[RankProcess]) -> None:
        """Kill the ranks ``processes`` (started here): every group whose exit status is not in,
        with one ``kill`` command, then release each (EOF, its exit status, its files, its channel),
        all waiting within one ``connect_timeout``. Never raises."""
        mine = [p for p in processes if isinstance(p, SSHProcess) and not p._released]
        deadline = time.monotonic() + self.settings.connect_timeout
        try:
            live = [p.pgid for p in mine if not p.exited()]
            if live:
                self.signal_groups(live, signal.SIGKILL)
        finally:
            for process in mine:
                process.release_by(deadline)

    # -- commands ---------------------------------------------------------------------

    def run(self, client: paramiko.SSHClient, command: str, stdin: bytes | None = None) -> tuple[int, str]:
        """Run a short ``command`` (fed ``stdin``, then EOF): its exit status and its output (stdout
        and stderr, stripped). At most COMMANDS_PER_CONNECTION run at once (sshd's MaxSessions)."""
        with self._talking(f"running {command.split()[0]}"):
            if not self._commands.acquire(timeout=self.settings.connect_timeout):
                raise TimeoutError
            try:
                channel = self._session(client)
                try:
                    channel.settimeout(self.settings.connect_timeout)
                    channel.set_combine_stderr(True)
                    channel.exec_command(command)
                    if stdin is not None:
                        channel.sendall(stdin)
                        channel.shutdown_write()
                    out = _StdoutFile(channel, "rb")
                    try:
                        output = out.read()
                    finally:
                        _close_file(cast(IO[bytes], out))
                    if not channel.status_event.wait(self.settings.connect_timeout):
                        raise TimeoutError
                    return channel.recv_exit_status(), output.decode("utf-8", "replace").strip()
                finally:
                    channel.close()
            finally:
                self._commands.release()

    def signal_groups(self, pgids: Sequence[int], signum: int, client: paramiko.SSHClient | None = None) -> None:
        """Send ``signum`` to the remote process groups ``pgids`` with one ``kill`` command (one
        session, however many groups); no error if one is gone or the host cannot be reached."""
        if not pgids:
            return
        name = signal.Signals(signum).name
        client = client or (self._clients[0] if self._clients else None)
        if self._lost is not None or client is None:
            log.debug("host %s: %s; cannot send %s to pgid %s", self.host.name, self._lost or "not connected", name,
                      " ".join(map(str, pgids)))
            return
        try:
            status, output = self.run(client, kill_command(pgids, signum))
        except HostUnreachable as exc:
            log.warning("%s; cannot send %s to its ranks (pgid %s)", exc, name, " ".join(map(str, pgids)))
            return
        if status != 0:
            log.debug("host %s: kill %s -- %s: %s", self.host.name, name, " ".join(map(str, pgids)), output)

    def _session(self, client: paramiko.SSHClient) -> paramiko.Channel:
        if self._lost is not None:
            raise EOFError(self._lost.split(": ", 1)[-1])
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise EOFError("the connection is closed")
        return transport.open_session(timeout=self.settings.connect_timeout)

    def _read_pid(self, channel: paramiko.Channel, stdout: IO[bytes], stderr: IO[bytes],
                  argv: Sequence[str], cwd: str) -> int:
        channel.settimeout(self.settings.connect_timeout)
        what = f"{self.who}: cannot start {shlex.join(argv)} in {cwd}"
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
            if self._lost is not None:
                raise HostUnreachable(self.host.name, self._lost) from None
            raise HostUnreachable(self.host.name, f"{self._where()}: no answer within "
                                                  f"{self.settings.connect_timeout:g}s "
                                  f"while {doing}") from None
        except (paramiko.SSHException, EOFError, ConnectionError) as exc:
            if self._lost is not None:
                raise HostUnreachable(self.host.name, self._lost) from None
            raise HostUnreachable(self.host.name, f"{self._where()}: SSH connection failed while {doing}: "
                                  f"{_reason(exc)}") from None

    def _where(self) -> str:
        return self._endpoint.where if self._endpoint else self.who

    # -- connections ------------------------------------------------------------------

    def connection(self) -> paramiko.SSHClient:
        """The host's first connection (made now if it is not yet): for commands, and for what
        rides on SSH besides ranks (the Docker API of a machine)."""
        return self._main()

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
