"""Chrome DevTools' trace engine (npm's @paulirish/trace_engine, the performance panel's parser), for
the tests that load the lab's --trace files as a browser's tools do. ``python3 tests/tools/trace_engine.py
install`` (tests/setup-host.sh runs it) fetches the pinned packages from the npm registry, checks each
against its published sha512, and unpacks them under tests/.trace-engine; :func:`parse` runs
parse_trace.mjs on a file with node. Standard library only."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent / ".trace-engine"
MODULES = ROOT / "node_modules"
REGISTRY = "https://registry.npmjs.org"
TIMEOUT = 60  # seconds for each download
# (name, version, sha512 as npm publishes it): the engine and the two packages it imports
PACKAGES = (
    ("@paulirish/trace_engine", "0.0.65",
     "Qsm6F5C8xf6ZzQXbQc2+wcpe6sggfs/gvc/ytqSurdvYg3kyW0ECHCqE0CWBKZpqgjVfPNX9c7SCS3r2nEIRGg=="),
    ("third-party-web", "0.30.0",
     "p+PfyL5U0ediGzvwPzMSdD9MnC8rHW6nWJJVLIQvqN7RsSqfaZ+7n4c9GILqH36EYR0eXB9CzAeCRnKFr/9uJg=="),
    ("legacy-javascript", "0.0.1",
     "lPyntS4/aS7jpuvOlitZDFifBCb4W8L/3QU0PLbUTUj+zYah8rfVjYic88yG7ZKTxhS5h9iz7duT8oUXKszLhg=="),
)


def installed() -> bool:
    return all((MODULES / name / "package.json").is_file() for name, _, _ in PACKAGES) and bool(shutil.which("node"))


def install() -> None:
    for name, version, integrity in PACKAGES:
        target = MODULES / name
        if (target / "package.json").is_file():
            continue
        url = f"{REGISTRY}/{name}/-/{name.rsplit('/', 1)[-1]}-{version}.tgz"
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            data = response.read()
        if base64.b64encode(hashlib.sha512(data).digest()).decode() != integrity:
            raise SystemExit(f"{url}: its sha512 is not the one npm publishes")
        shutil.rmtree(target, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive.getmembers():
                if not member.name.startswith("package/") or member.issym() or member.islnk():
                    continue
                member.name = member.name.removeprefix("package/")
                archive.extract(member, target, filter="data")


def parse(path: Path) -> dict[str, Any]:
    """What DevTools' trace engine makes of a trace file (see parse_trace.mjs)."""
    script = ROOT / "parse_trace.mjs"
    shutil.copyfile(HERE / "parse_trace.mjs", script)  # (node resolves the packages from the script's folder)
    done = subprocess.run(["node", str(script), str(path)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"the trace engine could not load {path}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


if __name__ == "__main__" and sys.argv[1:] == ["install"]:
    install()
