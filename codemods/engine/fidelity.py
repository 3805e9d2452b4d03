"""Keep a file's bytes outside the lines the migration edited.

libcst does not give every source back exactly: it drops a form feed at the start of
a line and a lone carriage return ending the file. When a source has either, the
migrated text is laid over the original line by line: lines that match an original
line up to those two characters are taken from the original, edited and new lines
from the migration. (Comparing this way, rather than parsing the file a second time
to see what libcst reproduces, keeps large files cheap.)
"""

from __future__ import annotations

import difflib
import re

# Line ends as Python reads them: CRLF, lone CR, LF.
_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_LONE_CR = re.compile(rb"\r(?!\n)")


def _lines(data: bytes) -> list[bytes]:
    return _LINE.findall(data)


def _key(line: bytes) -> bytes:
    """A line as libcst might give it back."""
    return line.replace(b"\x0c", b"").rstrip(b"\r\n")


def at_risk(source: bytes) -> bool:
    """Whether libcst might not give ``source`` back byte for byte."""
    return b"\x0c" in source or _LONE_CR.search(source) is not None


def keep_untouched_lines(source: bytes, migrated: bytes) -> bytes:
    """``migrated`` with every line the migration did not edit taken from ``source``."""
    original, edited = _lines(source), _lines(migrated)
    matcher = difflib.SequenceMatcher(None, [_key(line) for line in original],
                                      [_key(line) for line in edited], autojunk=False)
    out: list[bytes] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        out.extend(original[i1:i2] if tag == "equal" else edited[j1:j2])
    return b"".join(out)
