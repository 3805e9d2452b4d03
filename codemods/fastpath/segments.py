"""Large files: hand libcst only the top-level statements that need it.

libcst costs about 5 us and 600 bytes of memory per source byte to parse, and the
scope analysis as much again, so a multi-megabyte module would take minutes and
gigabytes. A light scanner (strings, comments, brackets and line continuations only; no
parse) finds where each top-level statement starts and ends. A statement that contains
none of the words the map cares about is replaced by one marker line; one whose uses of
those words are all simple shapes (``simple_uses``) is replaced as well, and one copy of
each distinct use goes into a probe block (a function for uses in nested scopes, plain
module-level lines for the others) placed before the marker of the first statement
using it. A function that imports the old module itself is a pattern: one probe function
per distinct sequence of its imports and uses, indented as the function's body (the
lines of an import the engine wraps are indented from it), each import followed by a gap line
so that however the engine rewrites it (one import may become two) its new lines are
found. The reduced module goes through the engine unchanged; the markers
are swapped back for the original bytes, with every simple use rewritten the way the
engine rewrote its probe copy, and the probe's findings are repeated at every use.

Replacing a statement keeps everything around it (comments between statements stay
where libcst attaches them), so the engine sees the same structure it would see in
the whole file. Any doubt (a marker or a probe line not found as written) makes the
caller fall back to the whole file.
"""

from __future__ import annotations

import ast
import bisect
import itertools
import re
import secrets
from dataclasses import dataclass, field, replace

from ..engine.resolve import may_bind, parent_and_base
from ..engine.source_text import LINE_END, STRING_END
from ..movemap.schema import MoveMap
from ..report.findings import Finding
from .simple_uses import LocalImports, Use, statement_uses

_SCAN = re.compile(rb"""(?P<q>'''|\"\"\"|'|")|(?P<c>\#)|(?P<o>[(\[{])|(?P<x>[)\]}])|(?P<n>\r\n|\r|\n)|(?P<b>\\(?:\r\n|\r|\n))""")
_TRAILING_NEWLINE = re.compile(rb"(?:\r\n|\r|\n)\Z")
_CONTINUES = re.compile(rb"(?:else|elif|except|finally)\b")
_BLANK_OR_COMMENT = re.compile(rb"[ \t\f]*(?:#[^\r\n]*)?(?:\r\n|\r|\n|$)")
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
# a line starting ``def``/``class`` (``^`` alone misses lines after a lone CR)
_DEF_LINE = re.compile(rb"(?:^|(?<=\r))(?:async\s+)?(?:def|class)\b", re.M)
# ``NAME = "text"`` anywhere in a file is a constant to the engine: a patch target or a
# ``sys.modules`` key built from NAME (in a call these words name) is read through it
_CONSTANT = re.compile(
    rb"""(?m)(?:^|(?<=\r)|[;:])[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(?:\\(?:\r\n|\r|\n)[ \t]*)?(?:\(\s*)*[rRuU]?['"]"""
)
_READS_CONSTANTS = re.compile(rb"patch|setattr|delattr|sys\.modules")


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
            closing = STRING_END[match.group()].match(source, end)
            if closing is None:
                return None
            end = closing.end()
        elif kind == "c":
            line_end = LINE_END.search(source, end)
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
    return _DEF_LINE.search(text) is None


def constant_readers(source: bytes, spans: list[tuple[int, int]]) -> set[int]:
    """Indices of the statements libcst must see whatever words they contain: those
    that may build a patch target or a ``sys.modules`` key from a string constant, and
    those that assign the constants they use (the engine reads constants file-wide)."""
    assigned: dict[bytes, list[int]] = {}
    starts = [start for start, _ in spans]
    for match in _CONSTANT.finditer(source):
        k = bisect.bisect_right(starts, match.start(1)) - 1
        if k >= 0 and match.start(1) < spans[k][1]:
            assigned.setdefault(match.group(1), []).append(k)
    if not assigned:
        return set()
    names = re.compile(rb"\b(?:" + b"|".join(re.escape(n) for n in sorted(assigned)) + rb")\b")
    out: set[int] = set()
    for k in sorted({bisect.bisect_right(starts, m.start()) - 1 for m in _READS_CONSTANTS.finditer(source)}):
        if k < 0 or not names.search(source, *spans[k]):
            continue
        out.add(k)
        for used in set(names.findall(source, *spans[k])):
            out.update(assigned[used])
    return out


def watch_words(source: bytes, spans: list[tuple[int, int]], move_map: MoveMap) -> re.Pattern[bytes] | None:
    """Words whose presence makes a statement worth handing to libcst: names that left,
    the base names of every module involved, every name an import in a statement that
    mentions one of those bases binds, and every name an import binds to a package above
    an involved module (``import torch`` reaches ``torch.nn.functional``). None when such
    a statement does not parse."""
    modules = {move_map.old_module, move_map.new_module, *move_map.import_origins.values()}
    bases = {parent_and_base(m)[1] for m in modules}
    parts = {part for m in modules for part in m.split(".")}
    words = set(move_map.interesting) | bases
    mentions = re.compile(b"|".join(re.escape(b.encode()) for b in sorted(bases)))
    mentions_part = re.compile(b"|".join(re.escape(p.encode()) for p in sorted(parts)))
    for start, end in spans:
        chunk = source[start:end]
        if b"import" not in chunk or not mentions_part.search(chunk):
            continue
        try:
            tree = ast.parse(chunk)
        except (SyntaxError, ValueError):
            return None
        every_name = mentions.search(chunk) is not None
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if every_name or _reaches(node, alias, modules, parts):
                        words.add(alias.asname or alias.name.split(".")[0])
    words.discard("*")
    return re.compile(rb"\b(?:" + b"|".join(re.escape(w.encode()) for w in sorted(words)) + rb")\b")


def _reaches(node: ast.Import | ast.ImportFrom, alias: ast.alias, modules: set[str], parts: set[str]) -> bool:
    """Whether the name ``alias`` binds may be a package above (or at) an involved module."""
    if isinstance(node, ast.Import):
        bound = alias.name if alias.asname else alias.name.split(".")[0]
        return any(may_bind(m, bound) for m in modules)
    if node.level:  # the package is unknown here: any part of a module path may be it
        return alias.name in parts
    return any(may_bind(m, alias.name, node.module) for m in modules)


@dataclass(frozen=True)
class FastStatement:
    """A statement left out of the reduced module whose uses are copied from probes."""

    start: int  # byte offset in the file
    line: int  # 1-based line of the file it starts on
    uses: list[Use]
    shapes: list[int]  # index into ``Reduced.probes`` of each use's shape (for a use in a pattern, the pattern's)
    entries: list[int]  # which use of its pattern each use is (0 for the others)


@dataclass
class Reduced:
    """A module with the statements nobody cares about replaced by marker lines, and the
    statements whose uses are all simple shapes replaced as well: one copy of each
    distinct shape goes into a probe block placed before the marker of the first
    statement using it, so the engine meets it in the order the whole file would."""

    source: bytes
    token: str
    original: bytes
    runs: list[tuple[int, int, list[FastStatement]]]  # what each marker line stands for
    shifts: list[tuple[int, int]]  # (reduced line of a marker, original lines it stands for)
    skipped_words: set[str]  # identifiers in the replaced statements
    # (nested, kind, text) of each shape; a use in a nested scope reads the same bindings
    # anywhere, one in the module's scope only those made before it, so the latter is a
    # shape of its own in each run (no kept statement, so no binding, between its uses).
    # A pattern's kind is "local" and its text (its body's indentation, the (kind, text)
    # of each of its uses).
    probes: list[tuple[bool, str, bytes | tuple[tuple[str, bytes], ...]]] = field(default_factory=list)
    blocks: list[list[int]] = field(default_factory=list)  # shapes in each probe block
    # reduced line -> (shape, which use of a pattern (else 0), which of the use's lines)
    probe_lines: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    probe_heads: set[int] = field(default_factory=set)  # reduced lines of probe block headers

    def finish(self, new_source: bytes, findings: list[Finding]) -> tuple[bytes, list[Finding]] | None:
        """The whole file's new bytes and findings from the engine's run on the reduced
        module; None if anything is not where it has to be (the caller then runs on the
        whole file)."""
        read = self._read_probes(new_source)
        if read is None:
            return None
        stripped, rewritten = read
        out: list[Finding] = []
        per_shape: dict[tuple[int, int], list[tuple[int, int, Finding]]] = {}
        for finding in findings:
            place = self.probe_lines.get(finding.line)
            if place is not None:
                shape, entry, below = place
                nested, kind, text = self.probes[shape]
                indent = b"    "
                if kind == "local":
                    indent, entries = text
                    kind = entries[entry][0]
                # the first line is shifted by the probe's prefix, the others are as written
                start = len(_entry_prefix(nested, kind, self.token, indent)) + 1 if below == 0 else 1
                if finding.column < start:
                    return None
                per_shape.setdefault((shape, entry), []).append((below, finding.column - start, finding))
            elif finding.line in self.probe_heads:
                return None
            else:
                out.append(replace(finding, line=self.original_line(finding.line)))
        if per_shape:
            for _start, _end, fast in self.runs:
                for statement in fast:
                    for use, shape, entry in zip(statement.uses, statement.shapes, statement.entries):
                        for below, offset, finding in per_shape.get((shape, entry), ()):
                            column = use.column + 1 + offset if below == 0 else 1 + offset
                            out.append(replace(finding, line=statement.line + use.line - 1 + below, column=column))
            out.sort(key=lambda f: (f.line, f.column, f.code))
        restored = self.restore(stripped, rewritten)
        return None if restored is None else (restored, out)

    def _read_probes(self, new_source: bytes) -> tuple[bytes, list] | None:
        """``new_source`` without the probe blocks, and each shape's rewritten text (for
        a pattern, a list with one item per use)."""
        if not self.blocks:
            return new_source, []
        head = re.compile(f"(?:def )?_mm_codemod_probe_{self.token}_([0-9]+)(?:\\(\\):)?(?:\r\n|\r|\n)".encode())
        rewritten: list = [None] * len(self.probes)
        pieces, pos, seen = [], 0, []
        for match in head.finditer(new_source):
            pieces.append(new_source[pos : match.start()])
            pos = match.end()
            seen.append(int(match.group(1)))
            for shape in self.blocks[seen[-1]] if seen[-1] < len(self.blocks) else ():
                nested, kind, text = self.probes[shape]
                if kind != "local":
                    read = self._read_entry(new_source, pos, nested, kind, text)
                    if read is None:
                        return None
                    rewritten[shape], pos = read
                    continue
                indent, entries = text
                gap = re.compile(re.escape(indent) + f"_mm_codemod_gap_{self.token}(?:\r\n|\r|\n)".encode())
                items = []
                for entry_kind, entry_text in entries:
                    if entry_kind == "import":
                        read = _read_import(new_source, pos, gap, indent)
                    else:
                        read = self._read_entry(new_source, pos, True, entry_kind, entry_text, indent)
                    if read is None:
                        return None
                    item, pos = read
                    items.append(item)
                if not _invents_nothing(indent, entries, items):
                    return None
                rewritten[shape] = items
        pieces.append(new_source[pos:])
        if seen != list(range(len(self.blocks))) or any(r is None for r in rewritten):
            return None
        return b"".join(pieces), rewritten

    def _read_entry(
        self, new_source: bytes, pos: int, nested: bool, kind: str, text: bytes, indent: bytes = b"    "
    ) -> tuple[bytes, int] | None:
        """The rewritten text of one use's probe line(s) at ``pos``, and where they end."""
        lines = _count_lines(text) + 1  # as many as the use spans (rewrites keep them)
        ends = list(itertools.islice(LINE_END.finditer(new_source, pos), lines))
        if len(ends) < lines:
            return None
        end = ends[-1]
        entry = new_source[pos : end.start()]
        prefix = _entry_prefix(nested, kind, self.token, indent)
        if not entry.startswith(prefix):
            return None
        if kind == "arg":
            if not entry.endswith(b")"):
                return None
            return entry[len(prefix) : -1], end.end()
        if entry[len(prefix) :] != text:
            return None
        return text, end.end()

    def restore(self, new_source: bytes, rewritten: list) -> bytes | None:
        """``new_source`` with every marker swapped back (simple uses rewritten as their
        probes were); None if a marker is not there exactly once."""
        seen: list[int] = []
        pattern = re.compile(f"_mm_codemod_kept_{self.token}_([0-9]+)(?:\r\n|\r|\n)".encode())

        def original(match: re.Match[bytes]) -> bytes:
            seen.append(int(match.group(1)))
            return self._run_text(seen[-1], rewritten) if seen[-1] < len(self.runs) else b""

        out = pattern.sub(original, new_source)
        if sorted(seen) != list(range(len(self.runs))):
            return None
        return out

    def _run_text(self, k: int, rewritten: list) -> bytes:
        start, end, fast = self.runs[k]
        pieces, pos = [], start
        for statement in fast:
            for use, shape, entry in zip(statement.uses, statement.shapes, statement.entries):
                new = rewritten[shape]
                if self.probes[shape][1] == "local":
                    new = new[entry]
                if new != use.text:
                    pieces.append(self.original[pos : statement.start + use.start])
                    pieces.append(new)
                    pos = statement.start + use.end
        pieces.append(self.original[pos:end])
        return b"".join(pieces)

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


def _read_import(new_source: bytes, pos: int, gap: re.Pattern[bytes], indent: bytes) -> tuple[bytes, int] | None:
    """A pattern's import as the engine rewrote it (the lines up to the gap line after
    it, less the first one's indentation and the last one's end), and where the gap line
    ends; None unless there is at least one line, each indented at least as the body."""
    found = gap.search(new_source, pos)
    if found is None or found.start() == pos or new_source[found.start() - 1] not in b"\r\n":
        return None
    region = new_source[pos : found.start()]
    lines = LINE_END.split(region)
    if lines[-1] or not all(line.startswith(indent) for line in lines[:-1]):
        return None
    last_end = list(LINE_END.finditer(region))[-1]
    return region[len(indent) : last_end.start()], found.end()


def _invents_nothing(indent: bytes, entries: tuple[tuple[str, bytes], ...], items: list) -> bool:
    """Whether the engine's rewrite of a pattern's imports binds no name they did not
    bind: a name the engine invents is numbered file-wide, so one probe would not stand
    for many functions. (A use may read a name invented at module level: that binding
    is one for the whole file.)"""
    before = _import_bindings([text for kind, text in entries if kind == "import"], indent)
    after = _import_bindings([item for (kind, _), item in zip(entries, items) if kind == "import"], indent)
    return after is not None and before is not None and after <= before


def _import_bindings(texts: list[bytes], indent: bytes) -> set[str] | None:
    """The names the import statements ``texts`` (their lines after the first indented
    by ``indent``) bind; None if one does not parse as imports."""
    out = set()
    for text in texts:
        lines = LINE_END.split(text)
        try:
            tree = ast.parse(b"\n".join([lines[0], *(line[len(indent) :] for line in lines[1:])]))
        except (SyntaxError, ValueError):
            return None
        for node in tree.body:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                return None
            out.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
    return out


def _entry_prefix(nested: bool, kind: str, token: str, indent: bytes = b"    ") -> bytes:
    """How a probe line starts: indented in a probe function for a nested use, at the
    module's level otherwise; an expression is passed to a sink call (so a string is not
    taken for a docstring), a statement string or an import stands alone."""
    indent = indent if nested else b""
    return indent + f"_mm_codemod_sink_{token}(".encode() if kind == "arg" else indent


_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def _utf8(source: bytes) -> bool:
    """Whether the file is UTF-8 (no coding cookie naming anything else): uses are
    located by ``ast``'s UTF-8 byte offsets."""
    for line in LINE_END.split(source, 2)[:2]:
        cookie = _COOKIE.match(line)
        if cookie:
            return cookie.group(1).lower().replace(b"_", b"-") in (b"utf-8", b"utf8")
    return True


def reduce(source: bytes, move_map: MoveMap, *, simple_uses: bool = True) -> Reduced | None:
    """``source`` with its irrelevant top-level statements replaced (with
    ``simple_uses``, also those whose uses are all simple), or None when that would not
    save anything or the text cannot be scanned."""
    spans = statement_spans(source)
    if not spans:
        return None
    watched = watch_words(source, spans, move_map)
    if watched is None:
        return None
    simple_uses = simple_uses and _utf8(source)
    local_imports = LocalImports.for_map(move_map)
    readers = constant_readers(source, spans)
    skipped: set[bytes] = set()
    shapes: dict[tuple[int, str, bytes | tuple], int] = {}
    runs: list[list] = []  # [start, end, fast statements] of statements libcst does not need
    line, pos = 1, 0
    for k, (start, end) in enumerate(spans):
        line += _count_lines(source, pos, start)
        pos = start
        uses = None
        if k in readers:
            runs.append([-1, -1, []])
            continue
        if watched.search(source, start, end):
            found = statement_uses(source[start:end], watched, local_imports) if simple_uses and start > 0 else None
            if found is None:
                runs.append([-1, -1, []])
                continue
            uses, masked = found
            skipped.update(_WORD.findall(masked))
        else:
            skipped.update(_WORD.findall(source, start, end))
        if not runs or runs[-1][0] < 0:
            runs.append([start, end, []])
        runs[-1][1] = end
        if uses is not None:
            run = len(runs) - 1
            # the uses in a function body with its own imports of the old module form a
            # pattern: one shape for all of them, keyed by their indentation and texts
            members: dict[int, list[Use]] = {}
            for u in uses:
                if u.pattern >= 0:
                    members.setdefault(u.pattern, []).append(u)
            patterns = {k: (next(u.indent for u in group if u.kind == "import"), tuple((u.kind, u.text) for u in group))
                        for k, group in members.items()}
            keys, entries, seen = [], [], dict.fromkeys(members, 0)
            for u in uses:
                if u.pattern < 0:
                    keys.append(shapes.setdefault((-1 if u.nested else run, u.kind, u.text), len(shapes)))
                    entries.append(0)
                else:
                    keys.append(shapes.setdefault((-1, "local", patterns[u.pattern]), len(shapes)))
                    entries.append(seen[u.pattern])
                    seen[u.pattern] += 1
            runs[-1][2].append(FastStatement(start, line, uses, keys, entries))
    return _build(source, runs, [(scope < 0, kind, text) for scope, kind, text in shapes], skipped)


def _build(source: bytes, runs: list[list], probes: list, skipped: set[bytes]) -> Reduced | None:
    token = secrets.token_hex(6)
    kept: list[tuple[int, int, list[FastStatement]]] = []
    pieces: list[bytes] = []
    shifts: list[tuple[int, int]] = []
    blocks: list[list[int]] = []
    probe_lines: dict[int, int] = {}
    probe_heads: set[int] = set()
    next_shape = 0
    pos, line = 0, 1
    for start, end, fast in runs:
        if start < 0:
            continue
        chunk = source[start:end]
        newline = _TRAILING_NEWLINE.search(chunk)
        if newline is None:
            return None
        pieces.append(source[pos:start])
        line += _count_lines(source, pos, start)
        # shapes are numbered in order of first use, so the ones new here follow on
        last = max((k for statement in fast for k in statement.shapes), default=-1)
        new_shapes = list(range(next_shape, last + 1))
        block = 0  # lines the probe blocks take
        # consecutive shapes of one scope share a block (a function for nested uses, the
        # module's level for the others), so the engine meets them in the file's order;
        # a pattern is a function of its own
        def scope(shape: int) -> tuple[bool, int]:
            return probes[shape][0], shape if probes[shape][1] == "local" else -1

        for (nested, _), group in itertools.groupby(new_shapes, key=scope):
            group = list(group)
            head = f"_mm_codemod_probe_{token}_{len(blocks)}"
            pieces.append((f"def {head}():" if nested else head).encode() + newline.group())
            blocks.append(group)
            probe_heads.add(line + block)
            block += 1
            for shape in group:
                _, kind, text = probes[shape]
                indent, entries = text if kind == "local" else (b"    ", ((kind, text),))
                for entry, (entry_kind, entry_text) in enumerate(entries):
                    pieces.append(_entry_prefix(nested, entry_kind, token, indent) + entry_text
                                  + (b")" if entry_kind == "arg" else b"") + newline.group())
                    for below in range(_count_lines(entry_text) + 1):
                        probe_lines[line + block] = (shape, entry, below)
                        block += 1
                    if entry_kind == "import":  # then the line that shows where its rewrite ends
                        pieces.append(indent + f"_mm_codemod_gap_{token}".encode() + newline.group())
                        probe_heads.add(line + block)
                        block += 1
        line += block
        next_shape = max(next_shape, last + 1)
        pieces.append(f"_mm_codemod_kept_{token}_{len(kept)}".encode() + newline.group())
        kept.append((start, end, fast))
        shifts.append((line, _count_lines(chunk) - block))
        line += 1
        pos = end
    if not kept:
        return None
    pieces.append(source[pos:])
    return Reduced(b"".join(pieces), token, source, kept, shifts, {w.decode() for w in skipped},
                   probes, blocks, probe_lines, probe_heads)


def _count_lines(text: bytes, start: int = 0, end: int | None = None) -> int:
    return len(LINE_END.findall(text, start, len(text) if end is None else end))
