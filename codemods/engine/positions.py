"""Line and column of a few nodes, without resolving PositionProvider for the whole tree.

PositionProvider records a range for every node and costs ten times a plain code
generation; findings need positions for a handful of nodes, so one code generation
pass notes where those start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState  # stable since libcst 0.3; not re-exported

# the line breaks Python (and libcst) count: a lone CR ends a line as well
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=False)
class _MarkingState(CodegenState):
    targets: frozenset = frozenset()
    marks: dict = field(default_factory=dict)

    def before_codegen(self, node: cst.CSTNode) -> None:
        if node in self.targets and node not in self.marks:
            self.marks[node] = len(self.tokens)


def start_positions(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> dict:
    """node -> (line, column), both 1-based, where the node's own text starts."""
    targets = frozenset(nodes)
    if not targets:
        return {}
    state = _MarkingState(
        default_indent=module.default_indent,
        default_newline=module.default_newline,
        targets=targets,
    )
    module._codegen(state)
    order = sorted(state.marks.items(), key=lambda item: item[1])
    out: dict = {}
    line, column, consumed = 1, 0, 0
    tokens = state.tokens
    for node, index in order:
        while consumed < index:
            token = tokens[consumed]
            breaks = _LINE_BREAK.findall(token) if ("\n" in token or "\r" in token) else ()
            if breaks:
                line += len(breaks)
                column = len(token) - max(token.rfind("\n"), token.rfind("\r")) - 1
            else:
                column += len(token)
            consumed += 1
        out[node] = (line, column + 1)
    return out
