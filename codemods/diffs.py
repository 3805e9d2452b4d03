"""Unified diffs that ``git apply`` and ``patch -p1`` both accept, for any bytes.

Lines are split at ``\\n`` only, the way both tools read a patch: ``str.splitlines``
would also split at form feeds, lone carriage returns and U+2028, and a hunk built
from such lines no longer matches the file. The diff is computed on the raw bytes,
so a BOM, a latin-1 file with its coding cookie or CRLF endings come out as they are.
"""

from __future__ import annotations

import difflib
import re

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


def unified_diff(old: bytes, new: bytes, shown: str) -> bytes:
    """The patch turning ``old`` into ``new`` for the file at ``shown``, with ``a/`` and
    ``b/`` prefixes. A relative ``shown`` is taken from the folder the patch is applied
    in; an absolute one (a file outside the working folder) loses its leading slash, as
    in ``git diff --no-index``, so that part of the patch applies from ``/``."""
    name = shown.lstrip("/")
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
