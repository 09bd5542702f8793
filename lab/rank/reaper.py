"""Every process the lab starts on a host runs under this reaper, so nothing it starts outlives it.

``python -S -m lab.rank.reaper ARGV...`` makes itself the child subreaper of what it starts
(Linux ``PR_SET_CHILD_SUBREAPER``): a process that daemonizes (``setsid``, a double fork, a new
session) leaves its process group, but when its parent dies it is re-parented here, not to init.
The reaper starts ``ARGV`` in a process group of its own and prints that group's id
(``lab-pid:PGID``, the line every transport reads) before anything else is written: the lab
signals and kills that group, never the reaper. When the child ends, however it ends, the reaper
kills every process left below it, waits for them, and ends the way the child ended (its exit
status, or the same signal). Unless the child was killed (SIGKILL: the lab stopping it), what is
left gets up to LINGER seconds to end by itself first: a rank's output relay (``lab.rank.output``)
passes on the last lines of a rank that ended itself, then ends.

Standard library only and self-contained: the transports pass this file's code on the command
line (``python -S -c CODE ARGV...``, see ``lab.transport.base.supervised``), so it runs on any
host with a Python before anything is uploaded there. With ``--env-on-stdin`` first, the settings
to start ARGV with come on stdin, ahead of anything else (``LENGTH\nJSON``): what a command line
would show every user of the host (``ps``) stays between the lab and the process.

A launch started in a run directory (every process of a run is: ``lab.core.runner``) holds that
directory while it lives (a shared ``flock`` of its ``.lab-live``) and marks it used as it ends. The
first launch of a run removes the user's run directories beside it that a run left behind, one whose
controller was killed before it could clean up: nothing holds it, it is not kept (``--keep`` marks it
``.lab-kept``), and nothing of a run ended in it for STALE_AFTER seconds.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import pwd
import shutil
import signal
import stat
import sys
import time

PID_MARK = b"lab-pid:"  # = lab.rank.protocol.PID_MARK (this file imports nothing of the lab's)
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
SWEEP_LIMIT = 10.0  # seconds to spend killing what is left before giving up
LINGER = 1.0  # seconds what is left below an ended child gets to end by itself before it is killed
ENV_ON_STDIN = "--env-on-stdin"  # the flag before PROGRAM: its settings come on stdin (read_env)
RUN_DIR_PREFIX = "lab-run-"  # a run directory's name: this and 12 hex digits (= lab.core.plan.run_name's)
LIVE = ".lab-live"  # in a run directory: each live process of the run holds it (a shared flock)
KEPT = ".lab-kept"  # in a run directory: the run kept it (--keep), for the user to look at; never swept
STALE_AFTER = 86400.0  # seconds since anything of a run ended in its directory before it may be swept


def become_subreaper() -> bool:
    """Orphans below this process are re-parented to it, and no other process of this user can open
    its /proc/PID/fd or ptrace it (not dumpable): it holds the launch's streams, which are the lab's
    alone, and a rank's daemon re-parented here must not reach them. False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
                    and libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def below() -> list[int]:
    """This process's children, from the kernel's own list of them (/proc/self/task/*/children),
    which reads no other process's /proc entry: none is missed that /proc hides from this user (a
    process that is not dumpable, on a host whose /proc is mounted ``hidepid``). They stand for
    everything below: a live process below this one is one of them or has one above it (an orphan
    is re-parented here). Where the kernel keeps no such list, every process below, from /proc."""
    found: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", "rb") as f:
                found += [int(pid) for pid in f.read().split()]
    except FileNotFoundError:
        return descendants(os.getpid())
    except OSError:  # (a thread that ended meanwhile)
        pass
    return found


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def linger() -> None:
    """Reap what ends below this process by itself, until nothing is left or LINGER passes."""
    deadline = time.monotonic() + LINGER
    while time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not below():
            return
        time.sleep(0.005)


def sweep() -> None:
    """Kill everything below this process and reap it, until nothing is left (or SWEEP_LIMIT passes):
    its children first, then what is re-parented here as they go."""
    deadline = time.monotonic() + SWEEP_LIMIT
    while time.monotonic() < deadline:
        for pid in below():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:  # no child left: nothing can come back to us
            return
        time.sleep(0.01)


def read_env() -> dict[str, str]:
    """The settings sent on stdin, ``LENGTH\\nJSON`` (an object of strings), read to their last byte
    and not one byte further: the rest of stdin is the program's."""
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(header) > 12:
            raise ValueError("no settings on stdin")
        header += byte
    size, data = int(header), b""
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            raise ValueError("the settings on stdin end early")
        data += chunk
    env = json.loads(data)
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the settings on stdin are not an object of strings")
    return env


def is_run_dir_name(name: str) -> bool:
    digits = name[len(RUN_DIR_PREFIX):]
    return name.startswith(RUN_DIR_PREFIX) and len(digits) == 12 and all(c in "0123456789abcdef" for c in digits)


def hold_run_dir() -> int | None:
    """When this launch starts in a run directory, hold it (the descriptor of its LIVE file, under a
    shared lock), and, as the run's first, sweep the stale run directories beside it. Never blocks
    (a rank that holds the file under a lock of its own only keeps this one from being held); None
    where the launch is not in a run directory or the lock cannot be had."""
    here = os.getcwd()
    if not is_run_dir_name(os.path.basename(here)):
        return None
    try:
        first = not os.path.exists(LIVE)
        held = os.open(LIVE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(held, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(held)
        return None
    if first:
        sweep_stale_run_dirs(os.path.dirname(here))
    return held


def sweep_stale_run_dirs(parent: str) -> None:
    """Remove the run directories in ``parent`` that are this user's (real directories, not links),
    not kept, untouched for STALE_AFTER seconds and held by no live process."""
    try:
        names = [name for name in os.listdir(parent) if is_run_dir_name(name)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            facts = os.lstat(path)
            if not (stat.S_ISDIR(facts.st_mode) and facts.st_uid == os.getuid()
                    and time.time() - facts.st_mtime > STALE_AFTER and not os.path.lexists(os.path.join(path, KEPT))):
                continue
            live = os.open(os.path.join(path, LIVE), os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(live, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held: a process of that run lives)
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass
        finally:
            os.close(live)


def mark_used(held: int | None) -> None:
    """As a launch in a run directory ends: the directory was used now (its age counts from here)."""
    if held is not None:
        with contextlib.suppress(OSError):
            os.utime(".")


SHARE_GROUPS = "/run/lab-groups"  # (lab.containerlab.shares makes them) a folder per controller, a group per share user
SHARE_CONTROLLERS = ("cpu", "memory")


def join_share_group() -> None:
    """On a host with share groups (lab.containerlab.shares), a share user's launch joins its
    user's group in each controller before it starts anything: all it starts stays there."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return
    for controller in SHARE_CONTROLLERS:
        try:
            with open(f"{SHARE_GROUPS}/{controller}/{user}/cgroup.procs", "w") as members:
                members.write("0")  # (0: the writer)
        except OSError:  # (no such group here: this host has none, or this user is no share's)
            pass


def main(argv: list[str]) -> int:
    if argv[:1] == [ENV_ON_STDIN]:
        try:
            os.environ.update(read_env())
        except ValueError as exc:
            print(f"lab.rank.reaper: {exc}", file=sys.stderr)
            return 2
        argv = argv[1:]
    if not argv:
        print("usage: python -S lab/rank/reaper.py [--env-on-stdin] PROGRAM [ARG...]", file=sys.stderr)
        return 2
    become_subreaper()
    join_share_group()
    held = hold_run_dir()
    marked, mark_written = os.pipe()  # the program starts once the pid mark is out, never before it
    child = os.fork()
    if child == 0:  # the program: a process group of its own, the one the lab signals
        try:
            os.close(mark_written)
            os.setpgid(0, 0)
            os.read(marked, 1)  # (end of file: the reaper has written the mark)
            os.close(marked)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"lab.rank.reaper: cannot start {argv[0]}: {exc}\n".encode())
        os._exit(127)
    os.close(marked)
    with contextlib.suppress(OSError):  # (both sides set it: whichever runs first)
        os.setpgid(child, child)
    os.write(1, PID_MARK + b"%d\n" % child)
    os.close(mark_written)

    def stop(_signum: int, _frame: object) -> None:  # asked to end: the child's group goes first
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)

    for asked in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(asked, stop)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # (a stack dump is for the ranks)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        linger()
    sweep()
    mark_used(held)
    if os.WIFSIGNALED(status):  # end the same way, so that whoever waits for us sees the signal
        with contextlib.suppress(OSError, ValueError):  # (SIGKILL and SIGSTOP have no handler to reset)
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
        return 128 + os.WTERMSIG(status)  # (a signal that does not end a process)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
