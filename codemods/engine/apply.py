"""Step three of a file's migration: carry out the planned edits in one transform.

Only the nodes the plan names are swapped (``Edits.expressions`` for expressions, the
statement tables for imports); everything else is returned as libcst built it, so bytes
outside the edited lines stay as they were. A statement that became several is split
into one line each, or joined with semicolons where the original shared a line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst

from .edits import Edits

# A tool directive ending an import line (noqa, type: ignore, isort...) is repeated on
# the lines split off from it, so it keeps covering every one of them.
_PRAGMA = re.compile(r"#\s*(noqa|type:\s*ignore|pragma|pyright:|mypy:|isort:)")


class Apply(cst.CSTTransformer):
    def __init__(self, edits: Edits) -> None:
        super().__init__()
        self.edits = edits

    def _replacement(self, small: cst.CSTNode) -> list[cst.BaseSmallStatement] | None:
        parts = self._parts(small)
        return None if parts is None else parts[0]

    def _parts(self, small: cst.CSTNode):
        """(statements replacing ``small`` in order, index of ``small``'s own new form or
        None when it is deleted), or None when nothing is planned for it."""
        e = self.edits
        if not any(small in d for d in (e.statements, e.split_off, e.bindings_after, e.deleted, e.placed_before)):
            return None
        before = e.placed_before.get(small, [])
        head = [] if small in e.deleted else [e.current(small)]
        after = e.split_off.get(small, []) + e.bindings_after.get(small, [])
        return before + head + after, (len(before) if head else None)

    def on_leave(self, original, updated):
        if original in self.edits.expressions:
            return self.edits.expressions[original]
        if isinstance(original, cst.SimpleStatementLine):
            return self._line(original, updated)
        if isinstance(original, cst.SimpleStatementSuite):
            flat = self._flatten(original, updated)
            return updated if flat is None else updated.with_changes(body=_joined(flat, updated.body))
        return updated

    def _flatten(self, original, updated):
        flat: list[cst.BaseSmallStatement] = []
        touched = False
        for before, after in zip(original.body, updated.body):
            replacement = self._replacement(before)
            if replacement is None:
                flat.append(after)
            else:
                touched = True
                flat.extend(replacement)
        return flat if touched else None

    def _line(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        if len(original.body) > 1:
            flat = self._flatten(original, updated)
            return updated if flat is None else updated.with_changes(body=_joined(flat, updated.body))
        parts = self._parts(original.body[0])
        if parts is None:
            return updated
        flat, own = parts
        if not flat:
            return cst.RemovalSentinel.REMOVE
        own = 0 if own is None else own  # the first remaining statement takes the line's place
        trailing = updated.trailing_whitespace
        # the lines split off end as the line they came from (LF in a CRLF file stays LF)
        extra = cst.TrailingWhitespace(newline=trailing.newline)
        if trailing.comment is not None and _PRAGMA.match(trailing.comment.value):
            extra = trailing
        lines = []
        for i, small in enumerate(flat):
            leading = updated.leading_lines if i == 0 else ()
            if i == own:
                lines.append(updated.with_changes(body=[small], leading_lines=leading))
            else:
                lines.append(cst.SimpleStatementLine(body=[small], trailing_whitespace=extra,
                                                     leading_lines=leading))
        return cst.FlattenSentinel(lines) if len(lines) > 1 else lines[0]


def _joined(flat: list[cst.BaseSmallStatement], original: Sequence[cst.BaseSmallStatement]):
    """Small statements on one line, separated by semicolons; the last keeps the
    original last statement's (usually absent) semicolon."""
    out = []
    separator = cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" "))
    for i, small in enumerate(flat):
        if i < len(flat) - 1:
            if not isinstance(small.semicolon, cst.Semicolon):
                small = small.with_changes(semicolon=separator)
        else:
            small = small.with_changes(semicolon=original[-1].semicolon)
        out.append(small)
    return out
