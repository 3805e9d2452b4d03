"""The transform: one libcst pass per file applies the whole move map.

``migrate_source`` is the engine (what the CLI runs in its worker processes);
``MoveImportsCommand`` (defined in ``command.py``, importable from here as well)
exposes the same engine to ``python -m libcst.tool codemod``.

A file goes through three steps:

1. *collect* (``collect.py``) - one visit records import statements (with the block
   they sit in and any try/except around them), attribute uses of names that moved,
   calls that patch or look up names dynamically, string literals, ``__all__`` and
   every name in use;
2. *plan* - decide every edit and finding, one phase per module: ``plan_imports``
   (from-imports, star imports), ``plan_rebound`` (globals the new module rebinds),
   ``plan_attributes`` (uses of the old module object), ``plan_calls`` (patch targets,
   dynamic lookups, strings). Names are resolved by what they are bound to
   (``module_bindings``; scope analysis, computed only when a module object or a
   rebound global is involved), relative imports against the file's package; the
   phases share the tables of ``state.FileState``;
3. *apply* (``apply.py``) - one transformer swaps the planned nodes; nothing else is
   regenerated, so bytes outside edited lines stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .apply import Apply
from .findings import Finding
from .move_map import MoveMap
from .plan_calls import CallPlanning
from .plan_imports import ImportPlanning
from .positions import start_positions
from .relevance import Gate


@dataclass
class FileOutcome:
    """What the engine did to one source: new bytes (None: unchanged) and findings."""

    new_source: bytes | None
    findings: list[Finding] = field(default_factory=list)


class _FileMigration(ImportPlanning, CallPlanning):
    """One file's migration; the constructor collects, ``run`` plans and applies."""

    def run(self) -> tuple[cst.Module, list[Finding]]:
        # The order matters: attribute and call rewrites reach modules through the
        # imports as the first phase left them, the string phase skips strings a call
        # accounted for, and pruning needs every rewritten use.
        self.plan_from_imports()
        self.plan_module_attributes()
        self.plan_calls()
        self.plan_star_imports()
        self.plan_dynamic_strings()
        self.prune_unused_module_bindings()
        new_module = self.module
        if self.expr or self.current or self.after or self.after_bindings or self.deleted:
            new_module = self.module.visit(Apply(self))
        positions = start_positions(self.module, [r[0] for r in self.raw])
        findings = []
        for node, code, symbol, message, fixed in self.raw:
            line, column = positions.get(node, (1, 1))
            findings.append(Finding(self.path, line, column, code, symbol, message, fixed))
        findings.sort(key=lambda f: (f.line, f.column, f.code))
        return new_module, findings


def migrate_module(
    module: cst.Module, move_map: MoveMap, *, path: str = "<string>", package: str | None = None
) -> tuple[cst.Module, list[Finding]]:
    """Apply ``move_map`` to a freshly parsed module (it must not share nodes)."""
    return _FileMigration(module, move_map, package, path).run()


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
