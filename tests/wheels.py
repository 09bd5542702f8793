"""Wheels made in the tests: a package the hosts do not have, for ``lab launch --requirements``."""
from __future__ import annotations

import base64
import hashlib
import secrets
import zipfile
from pathlib import Path

# the tokenizer tests/projects/tokenized needs: bytes as tokens, the vocabulary a byte's 256 and 4 more
LABTOK = {"labtok/__init__.py": 'VOCAB = 260\n__version__ = "VERSION"\n\n\ndef encode(text):\n'
                                '    return [4 + b for b in text.encode("utf-8")]\n'}


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``files`` (path -> text; VERSION in a text is ``version``), as a
    build backend writes one: its METADATA, WHEEL and RECORD (each file's hash and size)."""
    dist = f"{name}-{version}.dist-info"
    entries = {path: text.replace("VERSION", version) for path, text in files.items()}
    entries[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    entries[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: lab-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{path},sha256={_digest(text)},{len(text.encode())}" for path, text in entries.items()]
    entries[f"{dist}/RECORD"] = "\n".join((*record, f"{dist}/RECORD,,")) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name_in, text in entries.items():
            wheel.writestr(name_in, text)
    return path


def tokenized_project(project: Path) -> str:
    """tests/projects/tokenized's copy in ``project`` made whole: its tokenizer's wheel in wheels/,
    of a version of its own (so the hosts have no environment of it yet), pinned in its
    requirements.txt; that version."""
    version = f"1.0.{secrets.randbelow(10**9)}"
    make_wheel(project / "wheels", "labtok", version, LABTOK)
    listed = project / "requirements.txt"
    listed.write_text(listed.read_text().replace("labtok==1.0", f"labtok=={version}"))
    return version


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
