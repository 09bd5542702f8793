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
import logging
import posixpath
import shlex
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, ClassVar, cast

import paramiko

from lab.errors import HostUnreachable, LabError, RunError
from lab.inventory.model import Host
from lab.rank.protocol import PID_MARK
from lab.transport.base import (
    RUN_DIR_MARK,
    RankProcess,
    Transport,
    Upload,
    archive,
    env_payload,
    keep_command,
    kill_command,
    made_run_dir,
    make_run_dir_command,
    remote_command,
    removable,
    upload_bytes,
)
from lab.transport.ssh.connections import Connections, is_up, reason
from lab.transport.ssh.settings import SSHSettings

log = logging.getLogger(__name__)

COMMANDS_PER_CONNECTION = 2  # short commands (kill, rm, an upload) at once on one connection: the spare sessions
SETTLE = 0.05  # seconds paramiko may take to mark a dropped connection inactive after its channels closed
LINES_BEFORE_PID = 100  # what a login script may print before the pid line


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
        self._connections = Connections(host, settings, self.who)
        self._lock = threading.Lock()  # the host is found lost once
        self._lost: str | None = None  # why the host is lost (it went silent), once it is
        self._ended_there = False  # its sessions were ended on the host, whose SSH server answered
        self._commands = threading.BoundedSemaphore(COMMANDS_PER_CONNECTION)

    # -- the Transport interface ------------------------------------------------------

    UNPACK: ClassVar[tuple[str, ...]] = ("tar", "-x", "-f", "-", "--no-same-owner")  # the uploads, from stdin

    def prepare(self, run_name: str, uploads: Mapping[str, Upload]) -> str:
        """Make the run directory and the directories of the uploads, and put every file there, in
        one command: a tar stream into ``tar -x`` on the host. A host without a working tar gets
        them over one SFTP session instead (closed again: it would hold a session slot), a round
        trip or more per file."""
        client = self._connections.main()
        subdirs = [d for d in (posixpath.dirname(relative) for relative in uploads) if d]
        files = archive(uploads, self.who)
        with self._talking("carrying the run's files"):
            status, output = self.run(client, make_run_dir_command(run_name, subdirs, self.UNPACK), files)
        run_dir = made_run_dir(output)
        if run_dir is None:
            raise RunError(f"{self.who}: cannot make the run directory {run_name} in its temp "
                           f"directory: {output.splitlines()[-1] if output else f'exit status {status}'}")
        self.run_dir = run_dir
        if status != 0:
            said = [line for line in output.splitlines() if not line.startswith(RUN_DIR_MARK)]
            log.info("host %s: tar cannot unpack the run's files (%s): %d files go over SFTP",
                     self.host.name, said[-1] if said else f"exit status {status}", len(uploads))
            with self._talking("uploading the lab's files"):
                self._put_over_sftp(client, run_dir, uploads)
        return run_dir

    def _put_over_sftp(self, client: paramiko.SSHClient, run_dir: str, uploads: Mapping[str, Upload]) -> None:
        try:
            sftp = client.open_sftp()
        except (paramiko.SSHException, EOFError) as exc:  # no SFTP subsystem: "Channel closed."
            if not is_up(client):
                raise
            raise RunError(f"{self.who}: cannot copy the run's files: its tar failed and it has no "
                           f"SFTP ({reason(exc)})") from None
        try:
            sftp.get_channel().settimeout(self.settings.connect_timeout)  # type: ignore[union-attr]
            for relative, source in uploads.items():
                target = posixpath.join(run_dir, relative)
                try:
                    with sftp.open(target, "wb") as remote:
                        remote.set_pipelined(True)
                        remote.write(upload_bytes(source, relative, self.who))
                except (TimeoutError, ConnectionError):
                    raise
                except OSError as exc:  # SFTP's answer (no such file, no space...)
                    raise RunError(f"{self.who}: cannot upload the run's {relative} to {target}: "
                                   f"{exc.strerror or exc}") from None
        finally:
            sftp.close()

    def cleanup(self, keep: bool = False, also: Sequence[str] = ()) -> None:
        """``rm -rf`` the run directory (if ``prepare`` made it) and ``also``; a failure is logged."""
        directories = removable([self.run_dir, *also]) if self.run_dir else []
        if not directories:
            return
        first = self._connections.first
        if self.is_lost or (first is not None and not is_up(first)):
            log.debug("%s: gone; %s is left there", self._connections.where, " ".join(directories))
            return  # (the run's error names the host; its files went down with it)
        try:
            status, output = self.run(self._connections.main(), keep_command(directories[0]) if keep
                                      else f"rm -rf -- {shlex.join(directories)}")
        except LabError as exc:
            log.warning("%s; %s is left on host %s", exc, " ".join(directories), self.host.name)
            return
        if status != 0:
            log.warning("host %s: cannot %s %s: %s", self.host.name, "mark kept" if keep else "remove",
                        " ".join(directories), output)

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> RankProcess:
        """Start ``argv`` on its own channel and read its pid (= its process group)."""
        client = self._connections.for_rank()
        command = remote_command(self.python, argv, cwd)
        with self._talking("starting a rank"):
            channel = self._session(client)
            channel.exec_command(command)
            channel.sendall(env_payload(env))
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
        status, output = self.run(self._connections.main(), "echo $SSH_CONNECTION")
        fields = output.split()
        return fields[2] if status == 0 and len(fields) == 4 else None

    def close(self) -> None:
        """Close every connection, the jump hosts' last; safe to call twice."""
        self._connections.close()

    # -- liveness ---------------------------------------------------------------------

    @property
    def is_lost(self) -> bool:
        return self._lost is not None

    def heard_since(self, since: float) -> bool:
        """Whether every connection to the host answered a keepalive sent after ``since``."""
        return self._lost is None and self._connections.answered_since(since)

    def reaches(self) -> bool:
        """Whether the host's first connection is made and still up."""
        first = self._connections.first
        return first is not None and is_up(first)

    def check_alive(self, ended: bool = False) -> None:
        """Raise HostUnreachable when the host is lost: a keepalive on one of its connections went
        unanswered for ``alive_timeout`` seconds, or one of its connections was closed from the
        other end (the host, or its machine, went down). Its connections are then closed, so that
        every read and every wait on them ends (a silent TCP connection would never end by itself).
        ``ended``: a rank's channel closed without an exit status, which is how paramiko shows a
        dropped connection a moment before it marks the connection inactive (SETTLE waits for it)."""
        if self._lost is None:
            now = time.monotonic()
            silent = self._connections.silent_for(now)
            closed = not self._connections.all_up(settle=SETTLE if ended else 0.0)
            down = self._down() if closed and silent < self.settings.alive_timeout else ""
            if silent < self.settings.alive_timeout and not down:
                return
            with self._lock:
                if self._lost is None:
                    self._lost = (f"{self._connections.where}: lost: " + (
                        f"no answer to SSH keepalives for {silent:.0f}s (the host or the network went silent)"
                        if silent >= self.settings.alive_timeout else
                        "its SSH connection was closed from the other end (the host went down, or its sshd), "
                        f"and its SSH server does not answer: {down}"))
                    log.debug("%s; closing its connections", self._lost)
                    self._connections.cut()
        raise HostUnreachable(self.host.name, self._lost)

    def _down(self) -> str:
        """Why the host, whose connections were closed from its end, is down ("" where it is not): its
        SSH server does not answer a new connection. Where it does, what closed them ran on the host,
        not the host going down: its user's processes (a rank that signals every process it may,
        ``kill(-1)``, ends its user's SSH sessions too, and may go on ending each new one: a login
        would be no test), and the ranks that ran through them ended without an exit status. The
        connections are let go: what comes next (the cleanup, the sweep) logs in anew."""
        why = self._connections.no_answer()
        if why:
            log.debug("%s: its SSH server does not answer after its connections were closed: %s", self.who, why)
            return why
        with self._lock:
            self._connections.close()
            if not self._ended_there:
                self._ended_there = True
                log.warning("%s: its SSH sessions were ended on the host, whose SSH server answers: by its user's "
                            "processes (a rank that signalled every process it may?); its ranks there ended with "
                            "them", self.who)
        return ""

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
        client = client or self._connections.first
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
        if channel.exit_status < 0:  # no exit status (yet): if the connection dropped, the host is lost
            self.check_alive(ended=True)
        raise RunError(f"{what}: {errors[-1] if errors else 'the remote shell ended without starting it'}")

    @contextmanager
    def _talking(self, doing: str) -> Iterator[None]:
        """Turn a broken or silent connection into :class:`HostUnreachable`."""
        try:
            yield
        except TimeoutError:
            if self._lost is not None:
                raise HostUnreachable(self.host.name, self._lost) from None
            raise HostUnreachable(self.host.name, f"{self._connections.where}: no answer within "
                                                  f"{self.settings.connect_timeout:g}s "
                                  f"while {doing}") from None
        except (paramiko.SSHException, EOFError, ConnectionError) as exc:
            if self._lost is not None:
                raise HostUnreachable(self.host.name, self._lost) from None
            raise HostUnreachable(self.host.name, f"{self._connections.where}: SSH connection failed while "
                                  f"{doing}: {reason(exc)}") from None

    # -- connections ------------------------------------------------------------------

    def connection(self) -> paramiko.SSHClient:
        """The host's first connection (made now if it is not yet): for commands, and for what
        rides on SSH besides ranks (the Docker API of a machine)."""
        return self._connections.main()
