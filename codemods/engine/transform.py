"""The transform: one libcst pass per file applies the whole move map.

``migrate_source`` is the engine (what the CLI runs in its worker processes);
``cli.libcst_command.MoveImportsCommand`` exposes the same engine to
``python -m libcst.tool codemod``.

A file's migration (``migration.Migration``) holds three things: the facts read from
the file before any edit (``facts.FileFacts``: the parsed module, what ``collect``
found in one visit, lazily the scope analysis), the edits planned so far
(``edits.Edits``) and the findings (``report.Reporter``). Rules are plain functions
of the migration, one file each in ``rules/``, run in the order of ``rules.RULES``; then
``apply.Apply`` swaps the planned nodes, so bytes outside edited lines stay as they were.

Files above ``SEGMENT_ABOVE`` bytes first go through ``segments.reduce``: the top-level
statements that mention none of the map's names are set aside, and so are those whose
uses are all simple shapes (one copy of each distinct use is planned instead), so libcst
only parses what can matter; the result is the same as the whole-file pass.
"""

from __future__ import annotations

import gc
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import libcst as cst

from .. import rules as rule_table
from ..fastpath.gate import Gate
from ..fastpath.segments import Reduced, reduce
from ..movemap.schema import MoveMap
from ..report.findings import Finding
from ..report.suppression import UNUSED, Suppressions, unused_findings
from .apply import Apply
from .migration import Migration
from .positions import start_positions

__all__ = ["FileOutcome", "migrate_module", "migrate_source"]

@dataclass
class FileOutcome:
    """What the engine did to one source: new bytes (None: unchanged) and findings."""

    new_source: bytes | None
    findings: list[Finding] = field(default_factory=list)
    suppressed: int = 0  # findings silenced by a suppression comment


# Files above this size go through ``segments``: only their statements that mention
# something the map cares about are parsed by libcst.
SEGMENT_ABOVE = 256 * 1024


def migrate_module(
    module: cst.Module, move_map: MoveMap, *, path: str = "<string>", package: str | None = None,
    taken_names: Iterable[str] = (), suppressions: Suppressions | None = None,
    selected: Collection[str] | None = None, source: bytes | None = None,
) -> tuple[cst.Module, list[Finding]]:
    """Apply ``move_map`` to a freshly parsed module (it must not share nodes).
    ``taken_names``: names bound in parts of the file the module does not contain.
    ``suppressions``: the file's suppression comments; the rules leave what they hold
    back alone (the findings they silence are filtered by ``migrate_source``).
    ``selected``: the codes to act on (default: ``rules.DEFAULT_SELECTION``); the others
    are neither applied nor reported. ``source``: the text ``module`` was parsed from
    (lets names bound simply skip the scope analysis)."""
    selected = rule_table.DEFAULT_SELECTION if selected is None else selected
    migration = Migration.start(module, move_map, package, path, suppressions, selected, source)
    migration.edits.taken_names.update(taken_names)
    for rule in rule_table.RULES:
        rule.plan(migration)
    original = migration.facts.module
    new_module = original.visit(Apply(migration.edits)) if migration.edits.any() else original
    raw = migration.report.raw
    positions = start_positions(original, [r[0] for r in raw])
    findings = []
    for node, code, symbol, message, fixed, line_offset in raw:
        if code not in selected:
            continue
        line, column = positions.get(node, (1, 1))
        if line_offset:
            line, column = line + line_offset, 1
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
    segment_above: int = SEGMENT_ABOVE,
    report_unused_suppressions: bool = False,
    selected: Collection[str] | None = None,
) -> FileOutcome:
    """Apply ``move_map`` to one file's source. Raises ``libcst.ParserSyntaxError``
    when the source cannot be parsed (and the gates let it through).
    ``selected``: the codes to act on (default: ``rules.DEFAULT_SELECTION``).
    ``report_unused_suppressions``: select ``MMS016`` as well, a finding for each
    suppression comment that silenced nothing."""
    raw = source.encode("utf-8") if isinstance(source, str) else source
    selected = frozenset(rule_table.DEFAULT_SELECTION if selected is None else selected)
    if report_unused_suppressions:
        selected |= {UNUSED}
    gate = gate or Gate.for_map(move_map)
    mentions = gate.mentions(raw)
    if not mentions and UNUSED not in selected:
        return FileOutcome(None, [])
    suppressions = Suppressions.parse(raw)
    unused = UNUSED in selected and suppressions is not None
    if not mentions and not unused:
        return FileOutcome(None, [])
    # a file with suppressions is planned whole: the rules read its comments' lines
    if len(raw) > segment_above and suppressions is None:
        reduced = reduce(raw, move_map)
        outcome = (_migrate_reduced(raw, reduced, move_map, path, package, gate, selected)
                   if reduced else None)
        if outcome is not None:
            return outcome
    if not gate.needs_transform(raw, package):
        return _suppressed(FileOutcome(None, []), suppressions, unused, path)
    new_bytes, findings = _libcst_pass(raw, move_map, path, package, suppressions=suppressions,
                                       selected=selected)
    return _suppressed(FileOutcome(None if new_bytes == raw else new_bytes, findings),
                       suppressions, unused, path)


def _libcst_pass(
    source: bytes, move_map: MoveMap, path: str, package: str | None, taken_names: Iterable[str] = (),
    suppressions: Suppressions | None = None, selected: Collection[str] | None = None,
) -> tuple[bytes, list[Finding]]:
    """Parse, plan and apply. A large tree is millions of objects, none in a reference
    cycle the pass needs freed, and every full collection would walk all of them again
    (a quarter of the time at 400 KB, more the larger the file), so the collector waits
    until the pass is done."""
    paused = len(source) > SEGMENT_ABOVE and gc.isenabled()
    if paused:
        gc.disable()
    try:
        module = cst.parse_module(source)
        new_module, findings = migrate_module(module, move_map, path=path, package=package,
                                              taken_names=taken_names, suppressions=suppressions,
                                              selected=selected, source=source)
        return new_module.bytes, findings
    finally:
        if paused:
            gc.enable()


def _suppressed(outcome: FileOutcome, suppressions: Suppressions | None, unused: bool,
                path: str) -> FileOutcome:
    """Drop the findings a suppression comment covering their line silences (the rules
    already left the edits of those codes alone) and, if asked, report the unused
    suppressions."""
    if suppressions is None:
        return outcome
    kept = [f for f in outcome.findings if not suppressions.take(f.line, f.code)]
    if unused:
        kept.extend(unused_findings(suppressions, path))
        kept.sort(key=lambda f: (f.line, f.column, f.code))
    return FileOutcome(outcome.new_source, kept, suppressions.silenced)


def _migrate_reduced(
    raw: bytes, reduced: Reduced, move_map: MoveMap, path: str, package: str | None, gate: Gate,
    selected: Collection[str],
) -> FileOutcome | None:
    """The migration of the reduced module, mapped back to the whole file; None when
    the whole file has to be processed instead."""
    if not gate.needs_transform(reduced.source, package):
        return FileOutcome(None, [])
    try:
        new_source, findings = _libcst_pass(reduced.source, move_map, path, package,
                                            reduced.skipped_words, selected=selected)
    except cst.ParserSyntaxError:
        return None  # the whole file reports it with its own positions
    finished = reduced.finish(new_source, findings)
    if finished is None:
        return None
    new_bytes, findings = finished
    return FileOutcome(None if new_bytes == raw else new_bytes, findings)

