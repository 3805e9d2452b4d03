"""Suppression comments, the way ``# noqa`` works for linters.

``# mm-schedule-codemod: ignore`` suppresses every code; ``# mm-schedule-codemod:
ignore[MMS001, MMS005]`` only those codes; ``# noqa: MMS001`` (ruff's and flake8's
comment, next to other tools' codes if need be) the ``MMS`` codes it lists. A bare
``# noqa`` is left to the linters. A comment covers the whole logical line it is on:
every line of a statement spread over several (a black-formatted call, a parenthesised
import, a decorator, a compound statement's header), whichever of them it is on.

A suppressed code is neither reported nor acted on: the rules leave the uses it covers
alone (a finding whose fix is held back is not raised either). Which suppressions were
used is recorded, so that unused ones can be reported (``MMS016``, like ruff's RUF100).
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

from .findings import Finding

MARKER = b"mm-schedule-codemod"
SUPPRESSION = re.compile(r"#\s*mm-schedule-codemod:\s*ignore(?:\[(?P<codes>[A-Za-z0-9,\s]*)\])?")
# ruff's form: codes after ``noqa:``, separated by commas or spaces; only the MMS codes of
# the list are this tool's
NOQA = re.compile(r"#\s*noqa:\s*(?P<codes>[A-Za-z]+[0-9]+(?:[,\s]+[A-Za-z]+[0-9]+)*)", re.IGNORECASE)
_NOQA_BYTES = re.compile(rb"#[ \t]*noqa:[^\r\n]*MMS[0-9]", re.IGNORECASE)
_OWN_CODE = re.compile(r"MMS[0-9]+", re.IGNORECASE)

# Codes settled for the whole tree, not by a line of a file: whether their suppressions
# were used is not known here.
TREE_CODES = frozenset({"MMS015"})

UNUSED = "MMS016"
CODES = {
    UNUSED: ("unused-suppression", "a suppression comment that suppressed nothing (off by "
               "default: --extend-select MMS016 or --report-unused-suppressions)"),
}
OFF_BY_DEFAULT = frozenset(CODES)


def mentioned(source: bytes) -> bool:
    """Whether ``source`` may hold a suppression comment (a bytes search)."""
    return MARKER in source or ((b"noqa" in source or b"NOQA" in source)
                                and _NOQA_BYTES.search(source) is not None)


def codes_in(comment: str) -> frozenset[str] | None:
    """The codes a suppression comment silences; an empty set means all of them, None
    that the comment is no suppression of this tool's."""
    match = SUPPRESSION.search(comment)
    if match is not None:
        codes = match.group("codes")
        return frozenset(c.strip().upper() for c in codes.split(",") if c.strip()) if codes else frozenset()
    match = NOQA.search(comment)
    if match is not None:
        own = frozenset(c.upper() for c in re.split(r"[,\s]+", match.group("codes"))
                        if _OWN_CODE.fullmatch(c))
        return own or None
    return None


def _logical_lines(source: bytes) -> list[tuple[int, int, list[tuple[int, str]]]]:
    """(first line, last line, [(line, comment)]) of each logical line that has comments:
    a statement with every line it spans (brackets, backslashes, multi-line strings), or
    a comment alone on its line. The regex over raw lines when tokenizing fails (the
    libcst pass reports the syntax error then): one line each."""
    out: list[tuple[int, int, list[tuple[int, str]]]] = []
    try:
        start, comments = None, []
        for token in tokenize.tokenize(io.BytesIO(source).readline):
            kind = token.type
            if kind == tokenize.COMMENT:
                if start is None:
                    out.append((token.start[0], token.start[0], [(token.start[0], token.string)]))
                else:
                    comments.append((token.start[0], token.string))
            elif kind == tokenize.NEWLINE or kind == tokenize.ENDMARKER:
                if start is not None and comments:
                    out.append((start, token.start[0], comments))
                start, comments = None, []
            elif start is None and kind not in _NOT_CODE:
                start = token.start[0]
        return out
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        text = source.decode("utf-8", "replace")
        return [(n, n, [(n, line[line.index("#"):])])
                for n, line in enumerate(re.split(r"\r\n|\r|\n", text), 1) if "#" in line]


_NOT_CODE = frozenset({tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING})


@dataclass
class Suppressions:
    lines: dict[int, frozenset[str]]  # line of a comment -> codes (empty: all)
    covering: dict[int, tuple[int, ...]]  # any line -> the suppression lines covering it
    used: dict[int, set[str]] = field(default_factory=dict)  # line -> codes it silenced
    silenced: int = 0  # findings and held-back fixes, counted once each

    @classmethod
    def parse(cls, source: bytes) -> Suppressions | None:
        """The file's suppressions, or None when it has none (the usual case, found by a
        bytes search)."""
        if not mentioned(source):
            return None
        lines: dict[int, frozenset[str]] = {}
        covering: dict[int, tuple[int, ...]] = {}
        for first, last, comments in _logical_lines(source):
            own = []
            for line, comment in comments:
                codes = codes_in(comment)
                if codes is not None:
                    lines[line] = codes
                    own.append(line)
            if own:
                for line in range(first, last + 1):
                    covering[line] = tuple(own)
        return cls(lines, covering) if lines else None

    def take(self, line: int, code: str) -> bool:
        """Whether a suppression covering ``line`` suppresses ``code``; if so, that
        suppression is used."""
        for where in self.covering.get(line, ()):
            codes = self.lines[where]
            if not codes or code in codes:
                self.used.setdefault(where, set()).add(code)
                self.silenced += 1
                return True
        return False

    def unused(self) -> list[tuple[int, str]]:
        """(line, what is unused) for each suppression that silenced nothing: a bare one
        that silenced no code, or each listed code that it did not silence."""
        out = []
        for line, codes in sorted(self.lines.items()):
            used = self.used.get(line, set())
            if not codes:
                if not used:
                    out.append((line, "ignore"))
            else:
                out.extend((line, code) for code in sorted(codes - TREE_CODES - used))
        return out


def unused_findings(suppressions: Suppressions, path: str) -> list[Finding]:
    out = []
    for line, what in suppressions.unused():
        message = ("suppression comment suppresses nothing on this line" if what == "ignore"
                   else f"suppression of {what} suppresses nothing on this line")
        out.append(Finding(path, line, 1, "MMS016", what, message + "; remove it", False))
    return out
