"""docs/extending.md cannot drift from the code: every `path::name` it points at is a file of the
repository that defines (or assigns) that name, and every `path` alone exists."""
from __future__ import annotations

import re

from .conftest import REPO

PAGE = REPO / "docs" / "extending.md"


def test_every_file_and_name_the_extending_page_points_at_exists() -> None:
    text = PAGE.read_text()
    named = re.findall(r"`((?:lab|tests)/[\w/.]+?)::(\w+)`", text)
    paths = re.findall(r"`((?:lab|tests)/[\w/.]+)`", text)
    assert len(named) >= 20, named  # (the page names what to write, not only where)
    missing = [path for path in paths if not (REPO / path).exists()]
    assert missing == []
    for path, name in named:
        source = (REPO / path).read_text()
        defined = re.search(rf"^\s*(?:def|class) {name}\b|^{name}\b.*=", source, re.MULTILINE)
        assert defined is not None, f"{path} defines no {name}"
