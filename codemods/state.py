"""The state one file's migration plans against, shared by every planning phase.

The phases (``plan_imports``, ``plan_rebound``, ``plan_attributes``, ``plan_calls``) are
mixins over ``FileState``: each reads the facts ``collect`` found and records edits in
the tables below, and a later phase must see what an earlier one planned (a use may
only reach a binding that survives; a name may only merge into an import that stays).
``apply.Apply`` reads the same tables to rewrite the tree. Scope analysis is the
expensive part of the libcst pass, so it is resolved only when a phase first asks.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from .collect import CallSite, ImportSite, collect
from .move_map import MoveMap


class FileState:
    def __init__(self, module: cst.Module, move_map: MoveMap, package: str | None, path: str):
        self.wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        self.module = self.wrapper.module
        self.map = move_map
        self.package = package
        self.path = path
        self.old = move_map.old_module
        self.new = move_map.new_module
        self.gone = frozenset(move_map.removed) | frozenset(move_map.unmapped_imports)
        self.interesting = (
            frozenset(move_map.moved) | frozenset(move_map.import_origins) | self.gone
        )
        found = collect(self.module, package, self.interesting)
        self.sites: list[ImportSite] = found.sites
        self.names_seen: set[str] = found.names_seen  # grows as planning adds names
        self.attr_words: set[str] = found.attr_words
        self.attributes: list[cst.Attribute] = found.attributes
        self.stores: set[cst.CSTNode] = found.stores
        self.all_names: set[str] = found.all_names
        self.docstrings: set[cst.CSTNode] = found.docstrings
        self.strings: list[cst.SimpleString] = found.strings
        self.calls: list[CallSite] = found.calls
        # planned edits, keyed by original nodes; ``apply.Apply`` carries them out
        self.current: dict[cst.CSTNode, cst.CSTNode] = {}  # statement -> its new form
        self.current_module: dict[cst.CSTNode, str] = {}  # retargeted from-import -> module
        self.after: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = {}  # split-off imports
        self.deleted: set[cst.CSTNode] = set()
        self.expr: dict[cst.CSTNode, cst.CSTNode] = {}
        self.handled_strings: set[cst.CSTNode] = set()  # strings a call already accounted for
        self.raw: list[tuple[cst.CSTNode, str, str, str, bool]] = []  # findings before positions
        self._scopes = None
        self._referents: dict[cst.CSTNode, Sequence] | None = None
        self._module_refs: dict[tuple, str] = {}
        self._skip_sites: set[int] = set()  # compatibility shims, left as written
        self._fresh: set[str] = set()  # module bindings this run added
        self._added: list[tuple[cst.CSTNode, int, str, str]] = []  # (block, index, module, ref)
        self.after_bindings: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = {}
        # module-object bindings of the old module whose uses were rewritten
        self._touched: dict[int, tuple[object, ImportSite]] = {}
        self._rewritten_uses: set[int] = set()

    # -- metadata -------------------------------------------------------------------
    @property
    def scopes(self):
        if self._scopes is None:
            self._scopes = self.wrapper.resolve(ScopeProvider)
        return self._scopes

    @property
    def referents(self) -> dict[cst.CSTNode, Sequence]:
        if self._referents is None:
            out: dict[cst.CSTNode, Sequence] = {}
            for scope in {s for s in self.scopes.values() if s is not None}:
                for access in scope.accesses:
                    out[access.node] = list(access.referents)
            self._referents = out
        return self._referents

    def _site_of(self, node: cst.CSTNode) -> ImportSite | None:
        return next((s for s in self.sites if s.node is node), None)

    def _current(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.current.get(node, node)

    # -- finding helpers --------------------------------------------------------------
    def report(self, node: cst.CSTNode, code: str, symbol: str, message: str, fixed: bool) -> None:
        self.raw.append((node, code, symbol, message, fixed))

    def report_move(self, node: cst.CSTNode, name: str, dest: str, how: str) -> None:
        if name in self.map.import_origins and name not in self.map.moved:
            self.report(node, "MMS003", name,
                        f"{how}: {self.old} only imported {name!r}; now from its origin {dest}",
                        True)
        elif self.map.moved[name].private:
            self.report(node, "MMS002", name,
                        f"{how}: private {name!r} moved to {dest}; it is private there and may "
                        "change without notice", True)
        else:
            self.report(node, "MMS001", name, f"{how}: {name!r} moved to {dest}", True)

    def report_gone(self, node: cst.CSTNode, name: str) -> None:
        statement = self.map.unmapped_imports.get(name)
        if statement is not None:
            self.report(node, "MMS010", name, f"{self.old} no longer binds {name!r}; it came from "
                        f"'{statement}', bind it the same way here", False)
        else:
            self.report(node, "MMS009", name, f"{name!r} was removed from {self.old} and has no "
                        "new home; rewrite this use by hand", False)
