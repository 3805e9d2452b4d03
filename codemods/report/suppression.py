"""Suppression comments, the way ``# noqa`` works for linters.

``# mm-schedule-codemod: ignore`` at the end of a line suppresses every code on that
line; ``# mm-schedule-codemod: ignore[MMS001, MMS005]`` only those codes. A suppressed
code is neither reported nor acted on: the rules leave the uses on that line alone (a
finding whose fix is held back is not raised either). Which suppressions were used is
recorded, so that unused ones can be reported (``MMS016``, like ruff's RUF100).
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

from .findings import Finding

MARKER = b"mm-schedule-codemod"
SUPPRESSION = re.compile(r"#\s*mm-schedule-codemod:\s*ignore(?:\[(?P<codes>[A-Za-z0-9,\s]*)\])?")

# Codes settled for the whole tree, not by a line of a file: whether their suppressions
# were used is not known here.
TREE_CODES = frozenset({"MMS015"})

CODES = {
    "MMS016": ("unused-suppression", "a suppression comment that suppressed nothing (reported "
               "with --report-unused-suppressions)"),
}


def codes_in(comment: str) -> frozenset[str] | None:
    """The codes a suppression comment silences; an empty set means all of them, None
    that the comment is no suppression."""
    match = SUPPRESSION.search(comment)
    if match is None:
        return None
    codes = match.group("codes")
    return frozenset(c.strip().upper() for c in codes.split(",") if c.strip()) if codes else frozenset()


def _comments(source: bytes) -> list[tuple[int, str]]:
    """(line, text) of each comment; the regex over raw lines when tokenizing fails (the
    libcst pass reports the syntax error then)."""
    try:
        return [(t.start[0], t.string) for t in tokenize.tokenize(io.BytesIO(source).readline)
                if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        text = source.decode("utf-8", "replace")
        return [(n, line[line.index("#"):]) for n, line in enumerate(re.split(r"\r\n|\r|\n", text), 1)
                if "#" in line]


@dataclass
class Suppressions:
    lines: dict[int, frozenset[str]]  # line -> codes (empty: all)
    used: dict[int, set[str]] = field(default_factory=dict)  # line -> codes it silenced
    silenced: int = 0  # findings and held-back fixes, counted once each

    @classmethod
    def parse(cls, source: bytes) -> Suppressions | None:
        """The file's suppressions, or None when it has none (the usual case, found by a
        bytes search)."""
        if MARKER not in source:
            return None
        lines = {}
        for line, comment in _comments(source):
            codes = codes_in(comment)
            if codes is not None:
                lines[line] = codes
        return cls(lines) if lines else None

    def covers(self, line: int, code: str) -> bool:
        codes = self.lines.get(line)
        return codes is not None and (not codes or code in codes)

    def take(self, lines, code: str) -> bool:
        """Whether one of ``lines`` suppresses ``code``; if so, that suppression is used."""
        for line in lines:
            if self.covers(line, code):
                self.used.setdefault(line, set()).add(code)
                self.silenced += 1
                return True
        return False

    def unused(self) -> list[tuple[int, str]]:
        """(line, what is unused) for each suppression that silenced nothing: a bare one
        that silenced no code, or each listed code that it did not silence."""
        out = []
        for line, codes in sorted(self.lines.items()):
            codes = codes - TREE_CODES
            used = self.used.get(line, set())
            if not self.lines[line]:
                if not used:
                    out.append((line, "ignore"))
            else:
                out.extend((line, code) for code in sorted(codes - used))
        return out


def unused_findings(suppressions: Suppressions, path: str) -> list[Finding]:
    out = []
    for line, what in suppressions.unused():
        message = ("suppression comment suppresses nothing on this line" if what == "ignore"
                   else f"suppression of {what} suppresses nothing on this line")
        out.append(Finding(path, line, 1, "MMS016", what, message + "; remove it", False))
    return out
