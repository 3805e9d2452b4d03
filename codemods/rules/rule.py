"""What a rule is: its codes, its planning function and its fast-path trigger, together."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.migration import Migration
    from ..fastpath.scan import Scan

# code -> (short name, what it means)
Codes = Mapping[str, tuple[str, str]]


@dataclass(frozen=True)
class Rule:
    """``plan`` reads the migration's facts and plans edits and findings; ``trigger`` says,
    from the file's ``ast`` scan alone, whether ``plan`` could do anything (it may say yes
    too often, never too rarely: a file no trigger lets through never reaches libcst).
    ``codes`` are the finding codes this rule raises and owns; those in
    ``off_by_default`` are acted on only when a selection names them (``--select``,
    ``--extend-select``, ``ALL``, a prefix); those in ``optional`` are acted on and
    reported by default but fail ``--check`` only when a selection names them (rewrites
    that are a tidy-up, not a fix)."""

    name: str
    plan: Callable[[Migration], None]
    trigger: Callable[[Scan], bool]
    codes: Codes = field(default_factory=dict)
    off_by_default: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()


def merge_codes(*tables: Codes) -> dict[str, tuple[str, str]]:
    """One table of every code, in code order; a code owned twice is a programming error."""
    merged: dict[str, tuple[str, str]] = {}
    for table in tables:
        for code, entry in table.items():
            if code in merged:
                raise ValueError(f"finding code {code} is owned by two rules")
            merged[code] = entry
    return dict(sorted(merged.items()))
