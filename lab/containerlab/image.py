"""The lab host image: tagged by a hash of its inputs, built only when they change.

The base is an official PyTorch CUDA runtime image by default. Where no registry
answers (``docker pull`` fails), an offline base is made with debootstrap, and torch
comes from a wheelhouse that pip fills on the engine's host (containers cannot reach
PyPI). See ../shared/ENVIRONMENT.md and images/lab-host/Dockerfile.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound

from lab.containerlab import state
from lab.containerlab.engine import EngineError, Say, reason, require_tool
from lab.transport.base import code_uploads

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
IMAGES_DIR = REPO / "images" / "lab-host"
REQUIREMENTS = REPO / "requirements.txt"  # the one place for the torch pin


def pinned_torch() -> str:
    """The torch version every host runs: the controller's pin in requirements.txt."""
    for line in REQUIREMENTS.read_text().splitlines():
        name, _, version = line.split("#")[0].strip().partition("==")
        if name == "torch" and version:
            return version
    raise EngineError(f"{REQUIREMENTS} pins no torch==VERSION")


TORCH_VERSION = pinned_torch()
TORCH = f"torch=={TORCH_VERSION}"
DEFAULT_BASE = f"pytorch/pytorch:{TORCH_VERSION}-cuda12.8-cudnn9-runtime"  # the official CUDA image of the pin
OFFLINE = "offline"  # --base offline: skip the pull, build the debootstrap base
WHEEL_PYTHON = "3.11"  # Debian bookworm's python3, the offline base's interpreter
DEBOOTSTRAP_PACKAGES = ("python3", "python3-pip", "openssh-server", "iproute2", "iptables",
                        "ca-certificates", "procps", "iputils-ping", "netcat-openbsd", "slurm-wlm", "munge",
                        "wireguard-go", "wireguard-tools")
HOST_IMAGE = "lab-host"
BASE_IMAGE = "lab-base"
SUMS = "SHA256SUMS"  # in the wheelhouse: each wheel's sha256, as pip downloaded it

Progress = Callable[[str], None]  # one line of a long step (debootstrap, the build)


def ensure_image(client: docker.DockerClient, base: str, state_dir: Path, say: Say,
                 progress: Progress) -> str:
    """The tag of an up-to-date lab host image, building what is missing."""
    with _one_maker(state_dir, say):
        base_ref = resolve_base(client, base, state_dir, say, progress)
        wheels = ensure_wheelhouse(state_dir / "wheels", say)
        tag = ensure_built(client, HOST_IMAGE, base_ref, _context_files(wheels), say, progress, wheels)
        client.images.get(tag).tag(HOST_IMAGE, "latest")  # what compose/lab.yml starts
        _untag_older(client, tag)
    return tag


@contextlib.contextmanager
def _one_maker(state_dir: Path, say: Say) -> Iterator[None]:
    """The image and what it is made of (the base, the wheelhouse in ``state_dir``) made by one command
    at a time: another that makes them (a second ``lab up``, ``lab grade``'s sandbox) waits, then
    finds them made. The lock goes with its holder, however it ends."""
    fd = os.open(state.ensure_dir(state_dir) / "image.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another lab command is making the host image: waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (which lets go of the lock)


def ensure_built(client: docker.DockerClient, repository: str, base_ref: str, files: dict[str, Path], say: Say,
                 progress: Progress, hashed: Mapping[Path, str] | None = None) -> str:
    """``repository``:HASH built from ``files`` (build-context path -> file, a Dockerfile among them)
    on ``base_ref``, unless it is there already; HASH is of every input's content (``hashed``: the
    files whose sha256 is known already)."""
    tag = f"{repository}:{_digest(client.images.get(base_ref).id, files, hashed or {})}"
    try:
        client.images.get(tag)
        say(f"image {tag} is up to date")
    except ImageNotFound:
        say(f"building image {tag} on {base_ref}")
        _build(client, files, tag, base_ref, progress)
    return tag


def _untag_older(client: docker.DockerClient, current: str) -> None:
    """Remove the tags of earlier lab host images (their layers go with them unless shared), so
    each change of the lab's code does not leave another image behind; one a container still
    uses stays."""
    for image in client.images.list(name=HOST_IMAGE):
        for tag in image.tags:
            if tag not in (current, f"{HOST_IMAGE}:latest"):
                try:
                    client.images.remove(tag)
                except APIError as exc:
                    log.debug("keeping %s: %s", tag, exc)


def resolve_base(client: docker.DockerClient, base: str, state_dir: Path, say: Say,
                 progress: Progress) -> str:
    """An image present on the engine to build on: local, pulled, or made offline."""
    if base != OFFLINE:
        try:
            client.images.get(base)
            return base
        except ImageNotFound:
            pass
        try:
            say(f"pulling {base}")
            client.images.pull(base)
            return base
        except (APIError, DockerException) as exc:
            say(f"cannot pull {base} ({reason(exc)}): building an offline base with debootstrap instead")
    return offline_base(client, state_dir, say, progress)


def offline_base(client: docker.DockerClient, state_dir: Path, say: Say, progress: Progress,
                 packages: tuple[str, ...] = DEBOOTSTRAP_PACKAGES, repository: str = BASE_IMAGE) -> str:
    """Debian bookworm with ``packages``, made with debootstrap and imported as an image (about a
    minute, once)."""
    tag = f"{repository}:bookworm-{hashlib.sha256(' '.join(packages).encode()).hexdigest()[:12]}"
    try:
        client.images.get(tag)
        return tag
    except ImageNotFound:
        pass
    debootstrap = require_tool("debootstrap", "debootstrap", say)
    state.ensure_dir(state_dir)
    root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=state_dir))
    root.chmod(0o755)  # the chroot's /: mkdtemp's 0700 stops a package's own user (munge's postinst) at it
    archive = root.with_suffix(".tar")
    try:
        say(f"debootstrap: Debian bookworm into {root} (about a minute)")
        try:
            _stream([debootstrap, "--variant=minbase", f"--include={','.join(packages)}",
                     "bookworm", str(root)], progress)
        except EngineError as exc:  # its log goes with the root: say what it says first
            log_file = root / "debootstrap" / "debootstrap.log"
            lines = log_file.read_text(errors="replace").splitlines() if log_file.exists() else []
            cause = next((line for line in reversed(lines) if line.startswith(("E:", "dpkg:"))), None)
            raise EngineError(f"{exc}{f' ({cause.strip()})' if cause else ''}") from None
        say(f"importing {root} as {tag}")
        subprocess.run(["tar", "-C", str(root), "-cf", str(archive), "."], check=True, timeout=600)
        repository, version = tag.split(":")
        client.api.import_image_from_file(str(archive), repository=repository, tag=version)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        archive.unlink(missing_ok=True)
    return tag


def ensure_wheelhouse(wheels: Path, say: Say) -> dict[Path, str]:
    """torch and numpy wheels for the offline base's Python, downloaded once by pip into the lab's
    state, and each one's sha256 as :data:`SUMS` recorded it then; every wheel there is checked
    against it each time (they are installed as root in the image): one it does not list, or whose
    content changed, is StateError."""
    sums = wheels / SUMS
    state.ensure_dir(wheels)
    if not state.check_file(sums):
        say(f"making the wheelhouse {wheels} with pip ({TORCH}, numpy)")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                               "--python-version", WHEEL_PYTHON, "--dest", str(wheels), TORCH, "numpy"],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            tail = [line for line in done.stderr.splitlines() if "ERROR" in line][-1:] or ["see pip's output"]
            raise EngineError(f"pip download of {TORCH} failed: {tail[0]}")
        for wheel in wheels.glob("*.whl"):
            wheel.chmod(0o600)
        state.write(sums, "".join(f"{_sha256(w)}  {w.name}\n" for w in sorted(wheels.glob("*.whl"))).encode())
    recorded = {name: digest for digest, name in (line.split(None, 1) for line in sums.read_text().splitlines()
                                                   if line.strip())}
    seen = _verified(wheels)
    found = {}
    for wheel in sorted(wheels.glob("*.whl")):
        state.check_file(wheel)
        digest = seen.get(_stat_key(wheel)) or _sha256(wheel)
        if recorded.get(wheel.name) != digest:
            raise state.StateError(
                f"{wheel} is not a wheel the lab downloaded ({SUMS} does not list it)" if wheel.name not in recorded
                else f"{wheel} changed since the lab downloaded it (its sha256 is not the one in {SUMS}): remove "
                     f"{wheels} to download the wheels again")
        found[wheel] = digest
    if sorted(w.name for w in found) != sorted(recorded):
        raise state.StateError(f"{wheels} lacks wheels its {SUMS} lists: remove {wheels} to download them again")
    state.write(wheels / VERIFIED, json.dumps({_stat_key(w): digest for w, digest in found.items()}).encode())
    return found


VERIFIED = ".verified"  # beside SUMS: each wheel as last hashed (name, size, mtime, inode -> sha256)


def _stat_key(wheel: Path) -> str:
    info = wheel.stat()
    return f"{wheel.name} {info.st_size} {info.st_mtime_ns} {info.st_ino}"


def _verified(wheels: Path) -> dict[str, str]:
    """The wheels hashed before, unchanged since (the same size, time and inode): their hashes are
    not read again (a build reads 200 MB of torch less)."""
    try:
        if not state.check_file(wheels / VERIFIED):
            return {}
        seen = json.loads((wheels / VERIFIED).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in seen.items()} if isinstance(seen, dict) else {}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _context_files(wheels: Mapping[Path, str]) -> dict[str, Path]:
    """Build-context path -> file: the image's own files, the wheels, the rank-side code."""
    files = {p.name: p for p in sorted(IMAGES_DIR.iterdir()) if p.is_file()}
    files.update({f"wheels/{p.name}": p for p in sorted(wheels)})
    files.update({name.removeprefix("code/"): path for name, path in code_uploads().items()})
    return files


def _digest(base_id: str, files: dict[str, Path], hashed: Mapping[Path, str]) -> str:
    """A hash of every input: the base image, and each file's path and content (its sha256)."""
    h = hashlib.sha256(f"{base_id} {TORCH}".encode())
    for name, path in sorted(files.items()):
        h.update(f"{name} {hashed[path] if path in hashed else _sha256(path)}\n".encode())
    return h.hexdigest()[:12]


def _build(client: docker.DockerClient, files: dict[str, Path], tag: str, base: str,
           progress: Progress) -> None:
    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as tar:
            for name, path in files.items():
                tar.add(str(path), arcname=name)
        context.seek(0)
        for chunk in client.api.build(fileobj=context, custom_context=True, tag=tag, rm=True,
                                      forcerm=True, decode=True,
                                      buildargs={"BASE": base, "TORCH_VERSION": TORCH_VERSION}):
            if "error" in chunk:
                raise EngineError(f"building {tag} failed: {chunk['error'].strip()}")
            for line in chunk.get("stream", "").splitlines():
                if line.strip():
                    progress(line.strip())


def _stream(argv: list[str], progress: Progress) -> None:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "LC_ALL": "C"})
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-5:]
        progress(line.rstrip())
    if proc.wait() != 0:
        raise EngineError(f"{Path(argv[0]).name} failed: {tail[-1] if tail else proc.returncode}")
