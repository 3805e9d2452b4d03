"""Keep a file's bytes outside the lines the migration edited.

libcst does not reproduce every source exactly: it drops a form feed at the start
of a line and a lone carriage return ending the file. When a source has either, the
migrated text is laid over the original line by line: lines libcst would have
reproduced unchanged are taken from the original file, edited and new lines from
the migration.
"""

from __future__ import annotations

import difflib
import re

import libcst as cst

# Line ends as Python reads them: CRLF, lone CR, LF.
_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_LONE_CR = re.compile(rb"\r(?!\n)")


def _lines(data: bytes) -> list[bytes]:
    return _LINE.findall(data)


def at_risk(source: bytes) -> bool:
    """Whether libcst might not give ``source`` back byte for byte."""
    return b"\x0c" in source or _LONE_CR.search(source) is not None


def keep_untouched_lines(source: bytes, migrated: bytes) -> bytes | None:
    """``migrated`` with every line the migration did not edit taken from ``source``;
    None when the two cannot be lined up (the caller then leaves the file alone)."""
    reproduced = cst.parse_module(source).bytes
    if reproduced == source:
        return migrated
    original, plain, edited = _lines(source), _lines(reproduced), _lines(migrated)
    if len(original) != len(plain):
        return None
    out: list[bytes] = []
    matcher = difflib.SequenceMatcher(None, plain, edited, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        out.extend(original[i1:i2] if tag == "equal" else edited[j1:j2])
    return b"".join(out)
