"""Findings as rules raise them: against nodes, turned into positions once at the end.

The codes and their wording belong to the rules that raise them (``rules/``); this is
only where a file's findings are collected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst


@dataclass(eq=False)
class Reporter:
    # (node, code, symbol, message, fixed, lines below the node's start), in the order
    # rules raised them
    raw: list[tuple[cst.CSTNode, str, str, str, bool, int]] = field(default_factory=list)

    def __call__(self, node: cst.CSTNode, code: str, symbol: str, message: str, fixed: bool,
                 line_offset: int = 0) -> None:
        self.raw.append((node, code, symbol, message, fixed, line_offset))
