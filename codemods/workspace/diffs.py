"""Unified diffs that ``git apply`` and ``patch -p1`` both accept, for any bytes.

Lines are split at ``\\n`` only, the way both tools read a patch: ``str.splitlines``
would also split at form feeds, lone carriage returns and U+2028, and a hunk built
from such lines no longer matches the file. The diff is computed on the raw bytes,
so a BOM, a latin-1 file with its coding cookie or CRLF endings come out as they are.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from .discovery import repository_top

_LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")
_NO_NEWLINE = b"\\ No newline at end of file\n"


def _lines(data: bytes) -> list[bytes]:
    return _LINE.findall(data)


def _quoted(name: str) -> bytes:
    """A path as git writes it in a header: C-quoted when it holds bytes outside
    printable ASCII, a quote, a backslash or a tab."""
    raw = name.encode("utf-8", "surrogateescape")
    if all(32 <= b < 127 and b not in b'"\\' for b in raw):
        return raw
    escapes = {ord("\\"): b"\\\\", ord('"'): b'\\"', ord("\t"): b"\\t", ord("\n"): b"\\n"}
    body = b"".join(escapes.get(b, bytes([b]) if 32 <= b < 127 else b"\\%03o" % b) for b in raw)
    return b'"' + body + b'"'


def patch_path(shown: str) -> str:
    """The name a patch gives the file a report names ``shown`` (relative to the working
    folder, or absolute): as ``git diff`` names it, relative to the top of the git
    repository the run is in, so that ``git apply`` works from any folder of it (from a
    subfolder it ignores paths that are not relative to the top); outside a repository,
    relative to the working folder; a file outside both by its absolute path without the
    leading slash, as ``git diff --no-index`` writes it (it applies from ``/``)."""
    cwd = Path.cwd().resolve()
    top = repository_top(cwd)
    if top is not None:
        try:
            return (cwd / shown).relative_to(top).as_posix()
        except ValueError:
            pass
    return shown.lstrip("/")


def unified_diff(old: bytes, new: bytes, name: str) -> bytes:
    """The patch turning ``old`` into ``new`` for the file at ``name`` (see ``patch_path``),
    with ``a/`` and ``b/`` prefixes."""
    a_name, b_name = _quoted("a/" + name), _quoted("b/" + name)
    out = [b"diff --git " + a_name + b" " + b_name + b"\n"]
    body = difflib.diff_bytes(difflib.unified_diff, _lines(old), _lines(new), a_name, b_name,
                              lineterm=b"\n")
    for line in body:
        if line.startswith((b"--- ", b"+++ ")):
            out.append(line.rstrip(b"\n") + b"\n")
        elif line.endswith(b"\n"):
            out.append(line)
        else:
            out.append(line + b"\n" + _NO_NEWLINE)
    return b"".join(out) if len(out) > 1 else b""
