"""Ranks of one host kept apart from each other: each a user of its own, with its own /tmp,
/dev/shm, POSIX message queues, pseudo-terminals and System V IPC.

Where the controller asks (``lab grade`` in a one-container sandbox: ``USERS_VAR`` names the first
user), the zygote (``lab.rank.zygote``), running as root, forks each rank as it always does, and
in the child, before anything of the rank's runs (:func:`enter`):

* unshares a mount and an IPC namespace of its own, with every mount private to it;
* mounts fresh, empty instances over /tmp, /dev/shm (each the size of what it covers, and running
  programs where that does), /dev/mqueue (the new IPC namespace's own) and /dev/pts, and binds
  the run directory back where it was (on /tmp, which the new /tmp covers);
* becomes user ``first user + rank`` (no supplementary groups), which drops every capability:
  its files, its processes, /proc of them and its signals are its own alone, and the kernel
  lets no rank ptrace, signal or look into another (nor the lab's processes, which stay root);
* sets a seccomp filter that refuses what Docker's profile allows only because the container
  has CAP_SYS_ADMIN (for the mounts above): new namespaces (``unshare``, ``clone`` with a
  namespace flag; ``clone3`` says ENOSYS, and the C library falls back to ``clone``), ``setns``
  and every call that mounts. So a rank can make no user namespace, and its kernel surface is
  what it was without the capability. It refuses UDP sockets too (IPv4 and IPv6): the ranks'
  only network is the loopback they share, where the launcher measures TCP alone.

What the ranks still share: the network namespace (they meet over the loopback's TCP, which the
launcher measures), so its abstract Unix sockets too; the process list (/proc shows
their command lines, nothing more); the run directory, read-only to them. The zygote makes the
run directory readable to the ranks' users (:func:`open_run_dir`: the code, the program), after
it has taken every rank's drawn inputs out of it (``lab.rank.inputs``).

Any step that fails stops the rank before it runs anything (:class:`IsolationError`): a rank
asked to be kept apart never runs together with the others.
"""
from __future__ import annotations

import ctypes
import os
import platform
import stat
import struct
from typing import Final

USERS_VAR: Final = "LAB_RANK_USERS"  # set in a launcher's environment: rank K runs as user (its value) + K
ISOLATED_VAR: Final = "LAB_RANK_ISOLATED"  # set in each rank kept apart: its temporary files go to its own /tmp

_CLONE_NEWNS, _CLONE_NEWIPC = 0x00020000, 0x08000000
# every CLONE_NEW* flag clone takes (CLONE_NEWTIME is unshare's and clone3's alone)
_NAMESPACE_FLAGS = 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | _CLONE_NEWNS
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_EPERM, _ENOSYS = 1, 38

# The calls the filter refuses, by architecture: its AUDIT_ARCH value, the numbers of unshare, setns
# and the calls that mount, clone's, clone3's and socket's.
_ARCHES: Final = {
    "x86_64": (0xC000003E, (272, 308, 165, 166, 155, 428, 429, 430, 431, 432, 433, 442), 56, 435, 41),
    "aarch64": (0xC00000B7, (97, 268, 40, 39, 41, 428, 429, 430, 431, 432, 433, 442), 220, 435, 198),
}
_AF_INET, _AF_INET6, _SOCK_DGRAM, _SOCK_TYPE = 2, 10, 2, 0xF  # (a socket's type, without its flags)
LAST_USER: Final = 2**31 - 1  # (uid_t is 32 bits; the kernel's own tools stop here)
_X32 = 0x40000000  # x86_64's x32 calls: their numbers with this bit (none is this filter's to allow)


class IsolationError(OSError):
    """A step of keeping a rank apart failed: the rank must not run."""


def user_of(first_user: int, rank: int) -> int:
    """The user rank ``rank`` runs as."""
    return first_user + rank


def open_run_dir(path: str, private: tuple[str, ...]) -> None:
    """Let the ranks' users read the run directory ``path`` (its folders and regular files, but for
    the names in ``private`` at its top); nothing in it becomes writable to them."""
    for top, folders, files in os.walk(path):
        if top == path:
            folders[:] = [f for f in folders if f not in private]
            files = [f for f in files if f not in private]
        os.chmod(top, 0o755)
        for name in files:
            full = os.path.join(top, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISREG(mode):
                os.chmod(full, 0o755 if mode & stat.S_IXUSR else 0o644)


def enter(user: int, run_dir: str) -> None:
    """In a forked rank, as root and with one thread, before anything of the rank's runs: keep it
    apart (see the module) as ``user``; IsolationError naming the step that failed."""
    if not 0 < user <= LAST_USER:
        raise IsolationError(f"cannot keep the rank apart: no user {user} to run it as (1 to {LAST_USER})")
    libc = ctypes.CDLL(None, use_errno=True)
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        raise IsolationError(f"cannot keep ranks apart on {platform.machine()}: no seccomp filter for it")
    step = "unshare a mount and an IPC namespace"
    try:
        _check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWIPC), step)
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
        kept = os.open(run_dir, os.O_PATH | os.O_DIRECTORY)
        for target, kind, options in (("/tmp", "tmpfs", "mode=1777"), ("/dev/shm", "tmpfs", "mode=1777"),
                                      ("/dev/mqueue", "mqueue", None),
                                      ("/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620")):
            step = f"mount a {kind} of its own on {target}"
            found = os.statvfs(target)  # (each as what it covers: its size, and whether it runs programs)
            if kind == "tmpfs":
                options = f"{options},size={found.f_blocks * found.f_frsize}"
            noexec = _MS_NOEXEC if kind != "tmpfs" or found.f_flag & os.ST_NOEXEC else 0
            _mount(libc, kind, target, kind, _MS_NOSUID | _MS_NODEV | noexec, options)
        step = f"bind the run directory {run_dir} back"
        os.umask(0o022)  # (the folders above it, on the new /tmp: open to the rank's user)
        os.makedirs(run_dir, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{kept}", run_dir, None, _MS_BIND, None)
        os.close(kept)
        os.chdir(run_dir)
        step = f"become user {user}"
        os.setgroups([])
        os.setresgid(user, user, user)
        os.setresuid(user, user, user)
        step = "set its seccomp filter"
        _filter(libc, *arch)
    except OSError as exc:
        raise IsolationError(f"cannot keep the rank apart: {step}: {exc.strerror or exc}") from None
    name = f"rank{user}"
    os.environ.update({ISOLATED_VAR: "1", "HOME": "/tmp", "TMPDIR": "/tmp", "TMP": "/tmp", "TEMP": "/tmp",
                       "USER": name, "LOGNAME": name})


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), what)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, kind: str | None, flags: int,
           options: str | None) -> None:
    encoded = [s.encode() if s is not None else None for s in (source, target, kind, options)]
    _check(libc.mount(encoded[0], encoded[1], encoded[2], ctypes.c_ulong(flags), encoded[3]), f"mount {target}")


def _filter(libc: ctypes.CDLL, audit_arch: int, refused: tuple[int, ...], clone: int, clone3: int,
            socket: int) -> None:
    """Install the seccomp filter (see the module) for this architecture's calls."""
    allow, deny, no_such = 0x7FFF0000, 0x00050000 | _EPERM, 0x00050000 | _ENOSYS
    load, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    bitand = 0x54  # BPF_ALU|BPF_AND|BPF_K
    first, second = 16, 24  # where a call's first and second arguments are (their low halves)
    program: list[tuple[int, int, int, int]] = [
        (load, 0, 0, 4),  # the architecture
        (jeq, 1, 0, audit_arch),
        (ret, 0, 0, deny),  # another architecture's calls (i386's, from an x86_64 process): none allowed
        (load, 0, 0, 0),  # the call's number
        (jset, 0, 1, _X32),
        (ret, 0, 0, deny),
    ]
    for number in refused:
        program += [(jeq, 0, 1, number), (ret, 0, 0, deny)]
    program += [(jeq, 0, 1, clone3), (ret, 0, 0, no_such),
                (jeq, 0, 4, clone), (load, 0, 0, first),  # clone's flags
                (jset, 0, 1, _NAMESPACE_FLAGS), (ret, 0, 0, deny), (ret, 0, 0, allow),
                (jeq, 0, 7, socket), (load, 0, 0, first),  # a socket's family, then its type: no UDP
                (jeq, 1, 0, _AF_INET), (jeq, 0, 4, _AF_INET6), (load, 0, 0, second), (bitand, 0, 0, _SOCK_TYPE),
                (jeq, 0, 1, _SOCK_DGRAM), (ret, 0, 0, deny),
                (ret, 0, 0, allow)]
    code = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(buffer))
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")
    _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "seccomp")
