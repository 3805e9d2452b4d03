"""The transform: one libcst pass per file applies the whole move map.

``migrate_source`` is the engine (what the CLI runs in its worker processes);
``MoveImportsCommand`` (defined in ``command.py``, importable from here as well)
exposes the same engine to ``python -m libcst.tool codemod``.

A file's migration (``migration.Migration``) holds three things: the facts read from
the file before any edit (``facts.FileFacts``: the parsed module, what ``collect``
found in one visit, lazily the scope analysis), the edits planned so far
(``edits.Edits``) and the findings (``report.Reporter``). Rules are plain functions
of the migration, one module per concern, run in the order of ``RULES``; then
``apply.Apply`` swaps the planned nodes, so bytes outside edited lines stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .apply import Apply
from .findings import Finding
from .migration import Migration
from .move_map import MoveMap
from .plan_attributes import plan_module_attributes, prune_unused_module_bindings
from .plan_calls import plan_calls
from .plan_imports import plan_from_imports
from .plan_star import plan_star_imports
from .plan_strings import plan_strings
from .positions import start_positions
from .relevance import Gate

# The order matters: attribute and call rewrites reach modules through the imports as
# the from-import rule left them, the string rule skips strings a call accounted for,
# and pruning needs every rewritten use.
RULES = (
    plan_from_imports,
    plan_module_attributes,
    plan_calls,
    plan_star_imports,
    plan_strings,
    prune_unused_module_bindings,
)


@dataclass
class FileOutcome:
    """What the engine did to one source: new bytes (None: unchanged) and findings."""

    new_source: bytes | None
    findings: list[Finding] = field(default_factory=list)


def migrate_module(
    module: cst.Module, move_map: MoveMap, *, path: str = "<string>", package: str | None = None
) -> tuple[cst.Module, list[Finding]]:
    """Apply ``move_map`` to a freshly parsed module (it must not share nodes)."""
    migration = Migration.start(module, move_map, package, path)
    for rule in RULES:
        rule(migration)
    original = migration.facts.module
    new_module = original.visit(Apply(migration.edits)) if migration.edits.any() else original
    raw = migration.report.raw
    positions = start_positions(original, [r[0] for r in raw])
    findings = []
    for node, code, symbol, message, fixed in raw:
        line, column = positions.get(node, (1, 1))
        findings.append(Finding(path, line, column, code, symbol, message, fixed))
    findings.sort(key=lambda f: (f.line, f.column, f.code))
    return new_module, findings


def migrate_source(
    source: bytes | str,
    move_map: MoveMap,
    *,
    path: str = "<string>",
    package: str | None = None,
    gate: Gate | None = None,
) -> FileOutcome:
    """Apply ``move_map`` to one file's source. Raises ``libcst.ParserSyntaxError``
    when the source cannot be parsed (and the gates let it through)."""
    raw = source.encode("utf-8") if isinstance(source, str) else source
    gate = gate or Gate.for_map(move_map)
    if not gate.mentions(raw) or not gate.needs_transform(raw, package):
        return FileOutcome(None, [])
    module = cst.parse_module(raw)
    new_module, findings = migrate_module(module, move_map, path=path, package=package)
    new_bytes = new_module.bytes
    return FileOutcome(None if new_bytes == raw else new_bytes, findings)


def __getattr__(name: str):
    # The libcst runner entry point lives in .command: importing libcst.codemod costs about
    # a second (it pulls in libcst.matchers), which the CLI's workers never need.
    if name == "MoveImportsCommand":
        from .command import MoveImportsCommand

        return MoveImportsCommand
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
