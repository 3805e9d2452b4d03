"""Large files: hand libcst only the top-level statements that could need an edit.

libcst costs about 5 us and 600 bytes of memory per source byte to parse, and the
scope analysis as much again, so a multi-megabyte module would take minutes and
gigabytes although almost all of it never mentions the old module. A light scanner
(strings, comments, brackets and line continuations only; no parse) finds where each
top-level statement starts and ends; every statement that contains none of the words
the map cares about is replaced by one marker line, the reduced module goes through
the engine unchanged, and the markers are swapped back for the original bytes.

Replacing a statement keeps everything around it (comments between statements stay
where libcst attaches them), so the engine sees the same structure it would see in
the whole file. Any doubt (a marker not found exactly once afterwards) makes the
caller fall back to the whole file.
"""

from __future__ import annotations

import ast
import bisect
import re
import secrets
from dataclasses import dataclass

from .move_map import MoveMap
from .resolve import parent_and_base

_SCAN = re.compile(rb"""(?P<q>'''|\"\"\"|'|")|(?P<c>\#)|(?P<o>[(\[{])|(?P<x>[)\]}])|(?P<n>\r\n|\r|\n)|(?P<b>\\(?:\r\n|\r|\n))""")
_STRING_END = {
    b"'''": re.compile(rb"(?:[^\\']|\\.|'(?!''))*'''", re.S),
    b'"""': re.compile(rb'(?:[^\\"]|\\.|"(?!""))*"""', re.S),
    b"'": re.compile(rb"(?:[^\\'\r\n]|\\(?:\r\n|.))*'", re.S),
    b'"': re.compile(rb'(?:[^\\"\r\n]|\\(?:\r\n|.))*"', re.S),
}
_LINE_END = re.compile(rb"\r\n|\r|\n")
_TRAILING_NEWLINE = re.compile(rb"(?:\r\n|\r|\n)\Z")
_CONTINUES = re.compile(rb"(?:else|elif|except|finally)\b")
_BLANK_OR_COMMENT = re.compile(rb"[ \t\f]*(?:#[^\r\n]*)?(?:\r\n|\r|\n|$)")
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")


def _line_starts(source: bytes) -> list[tuple[int, bool]] | None:
    """(offset, clean) for every line that does not start inside a string; clean when it
    also starts outside brackets and no backslash continues the line before. None when
    the scan cannot make sense of the text (an unterminated string)."""
    out = [(0, True)]
    depth = 0
    pos = 0
    search = _SCAN.search
    while True:
        match = search(source, pos)
        if match is None:
            return out
        kind = match.lastgroup
        end = match.end()
        if kind == "n":
            out.append((end, depth == 0))
        elif kind == "q":
            closing = _STRING_END[match.group()].match(source, end)
            if closing is None:
                return None
            end = closing.end()
        elif kind == "c":
            line_end = _LINE_END.search(source, end)
            end = line_end.start() if line_end else len(source)
        elif kind == "o":
            depth += 1
        elif kind == "x":
            depth = max(depth - 1, 0)
        elif kind == "b":
            out.append((end, False))
        pos = end


def statement_spans(source: bytes) -> list[tuple[int, int]] | None:
    """Byte ranges of the top-level statements (decorators included, comment and blank
    lines after a statement excluded), in order; None when the text cannot be scanned."""
    lines = _line_starts(source)
    if lines is None:
        return None
    starts: list[int] = []  # indices into ``lines`` of statement starts
    for k, (offset, clean) in enumerate(lines):
        if not clean or offset >= len(source):
            continue
        head = source[offset : offset + 1]
        if head in (b" ", b"\t", b"\f", b"#", b"\r", b"\n") or (offset == 0 and source.startswith(b"\xef\xbb\xbf")):
            continue
        if _CONTINUES.match(source, offset):
            continue
        if starts and source[lines[starts[-1]][0] : lines[starts[-1]][0] + 1] == b"@" and _decorator_only(source, lines, starts[-1], k):
            continue
        starts.append(k)
    spans = []
    for i, k in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else len(lines)
        last = stop - 1
        # trailing comment and blank lines belong to what follows, as in libcst
        while last > k and lines[last][1] and _BLANK_OR_COMMENT.fullmatch(
            source, lines[last][0], lines[last + 1][0] if last + 1 < len(lines) else len(source)
        ):
            last -= 1
        end = lines[last + 1][0] if last + 1 < len(lines) else len(source)
        spans.append((lines[k][0], end))
    return spans


def _decorator_only(source: bytes, lines, start: int, k: int) -> bool:
    """Whether the statement that began at line ``start`` (a decorator) has not reached its
    ``def``/``class`` before line ``k``: then line ``k`` still belongs to it."""
    text = source[lines[start][0] : lines[k][0]]
    return re.search(rb"^(?:async\s+)?(?:def|class)\b", text, re.M) is None


def watch_words(source: bytes, spans: list[tuple[int, int]], move_map: MoveMap) -> re.Pattern[bytes] | None:
    """Words whose presence makes a statement worth handing to libcst: names that left,
    the base names of every module involved, and every name an import in a statement
    that mentions one of those modules binds. None when such a statement does not parse."""
    modules = {move_map.old_module, move_map.new_module, *move_map.import_origins.values()}
    bases = {parent_and_base(m)[1] for m in modules}
    words = set(move_map.interesting) | bases
    mentions = re.compile(b"|".join(re.escape(b.encode()) for b in sorted(bases)))
    for start, end in spans:
        chunk = source[start:end]
        if not mentions.search(chunk):
            continue
        try:
            tree = ast.parse(chunk)
        except (SyntaxError, ValueError):
            return None
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    words.add(alias.asname or alias.name.split(".")[0])
    words.discard("*")
    return re.compile(rb"\b(?:" + b"|".join(re.escape(w.encode()) for w in sorted(words)) + rb")\b")


@dataclass
class Reduced:
    """A module with the statements nobody cares about replaced by marker lines."""

    source: bytes
    pattern: re.Pattern[bytes]  # a marker line; group 1 is its index in ``originals``
    originals: list[bytes]  # what each marker line stands for
    shifts: list[tuple[int, int]]  # (reduced line of a marker, original lines it stands for)
    skipped_words: set[str]  # identifiers in the replaced statements

    def restore(self, new_source: bytes) -> bytes | None:
        """``new_source`` with every marker swapped back; None if a marker is not there
        exactly once (the caller then runs on the whole file)."""
        seen: list[int] = []

        def original(match: re.Match[bytes]) -> bytes:
            seen.append(int(match.group(1)))
            return self.originals[seen[-1]]

        out = self.pattern.sub(original, new_source)
        if sorted(seen) != list(range(len(self.originals))):
            return None
        return out

    def original_line(self, line: int) -> int:
        """The line of the original file that reduced line ``line`` came from."""
        k = bisect.bisect_left(self._marker_lines, line)
        return line + (self._extra[k - 1] if k else 0)

    def __post_init__(self) -> None:
        self._marker_lines = [marker_line for marker_line, _ in self.shifts]
        self._extra = []
        total = 0
        for _, lines in self.shifts:
            total += lines - 1
            self._extra.append(total)


def reduce(source: bytes, move_map: MoveMap) -> Reduced | None:
    """``source`` with its irrelevant top-level statements replaced, or None when that
    would not save anything or the text cannot be scanned."""
    spans = statement_spans(source)
    if not spans:
        return None
    watched = watch_words(source, spans, move_map)
    if watched is None:
        return None
    token = secrets.token_hex(6)
    pieces: list[bytes] = []
    originals: list[bytes] = []
    shifts: list[tuple[int, int]] = []
    skipped: set[bytes] = set()
    runs: list[list[int]] = []  # [start, end] of consecutive statements nobody cares about
    for start, end in spans:
        if watched.search(source, start, end):
            runs.append([-1, -1])
        elif runs and runs[-1][0] >= 0:
            runs[-1][1] = end
        else:
            runs.append([start, end])
    pos = 0
    line = 1
    for start, end in runs:
        if start < 0:
            continue
        chunk = source[start:end]
        newline = _TRAILING_NEWLINE.search(chunk)
        if newline is None:
            return None
        pieces.append(source[pos:start])
        line += _count_lines(source, pos, start)
        pieces.append(f"_mm_codemod_kept_{token}_{len(originals)}".encode() + newline.group())
        originals.append(chunk)
        shifts.append((line, _count_lines(chunk)))
        skipped.update(_WORD.findall(chunk))
        line += 1
        pos = end
    if not originals:
        return None
    pieces.append(source[pos:])
    pattern = re.compile(f"_mm_codemod_kept_{token}_([0-9]+)(?:\r\n|\r|\n)".encode())
    return Reduced(b"".join(pieces), pattern, originals, shifts, {w.decode() for w in skipped})


def _count_lines(text: bytes, start: int = 0, end: int | None = None) -> int:
    return len(_LINE_END.findall(text, start, len(text) if end is None else end))
