"""Files a root script rewrites on a host (/etc/hosts, sshd's settings): whole, or not at all.

:func:`rewrite` is sh that writes a file's new content to a new file beside it, each step checked,
and only then puts it in the file's place: renamed over it where it can be, else (a container's
/etc/hosts is the engine's bind mount, which no rename may replace) written over it in place with
the space it needs taken first, so that a full disk fails before the file is touched. Any step
that fails ends the script with one line on stderr, the file as it was, and no new file left.
"""
from __future__ import annotations

import shlex

# The sh function every rewrite is made with: ``lab_rewrite FILE MAKE`` (MAKE: sh printing the content).
_FUNCTION = r"""lab_rewrite() (
  f=$1
  new=$(mktemp "$f.lab.XXXXXX" 2>/dev/null) || { echo "cannot write beside $f: left as it was" >&2; exit 1; }
  trap 'rm -f "$new"' EXIT
  eval "$2" > "$new" || { echo "cannot make $f anew (is the disk full?): left as it was" >&2; exit 1; }
  chmod --reference="$f" "$new" 2>/dev/null; chown --reference="$f" "$new" 2>/dev/null
  mv -f "$new" "$f" 2>/dev/null && exit 0
  size=$(wc -c < "$new") && have=$(wc -c < "$f") || exit 1
  fallocate -l "$size" "$f" 2>/dev/null || [ "$size" -le "$have" ] || {
    echo "no room to write $f (is the disk full?): left as it was" >&2; exit 1; }
  dd if="$new" of="$f" conv=notrunc,fsync status=none && truncate -s "$size" "$f" || {
    echo "writing $f failed halfway" >&2; exit 1; }
)"""


def rewrite(path: str, make: str) -> str:
    """sh that makes ``path`` hold what the sh ``make`` prints, whole or not at all (see the
    module): ``make`` ends with a status other than 0 to leave the file as it was (a ``grep -v``
    that keeps no line is no failure: ``grep -v ... || [ $? = 1 ]``). It is one command (a
    subshell), to be used as one: ``a || REWRITE``, ``REWRITE && b``."""
    return f"(\n{_FUNCTION}\nlab_rewrite {shlex.quote(path)} {shlex.quote(make)}\n)"  # (one command: `a || (...)`)
