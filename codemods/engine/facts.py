"""What is true of one file before any edit is planned; read-only for every rule.

``collect`` gathers the syntax facts in one visit; scope analysis (the expensive part of
the libcst pass) is resolved only when a rule first asks for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider

from ..movemap.schema import MoveMap
from .collect import Collected, ImportSite, collect
from .imports import alias_binding
from .plain_names import PlainNames
from .resolve import dotted_name, may_bind


@dataclass(frozen=True, eq=False)
class PlainRead:
    """A read of a plain name (in the shape of libcst's ``Access``)."""

    node: cst.Name


@dataclass(frozen=True, eq=False)
class PlainImport:
    """The one import binding a plain name (in the shape of libcst's ``ImportAssignment``)."""

    name: str
    node: cst.Import | cst.ImportFrom
    references: list[PlainRead]


@dataclass(frozen=True, eq=False)
class FileFacts:
    module: cst.Module
    wrapper: MetadataWrapper
    map: MoveMap
    package: str | None
    path: str
    found: Collected
    source: bytes | None = None  # the text ``module`` was parsed from, when known

    @classmethod
    def read(cls, module: cst.Module, move_map: MoveMap, package: str | None, path: str,
             source: bytes | None = None) -> FileFacts:
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        found = collect(wrapper.module, package, move_map.interesting, move_map.new_module)
        return cls(wrapper.module, wrapper, move_map, package, path, found, source)

    @property
    def old(self) -> str:
        return self.map.old_module

    @property
    def new(self) -> str:
        return self.map.new_module

    @property
    def sites(self) -> list[ImportSite]:
        return self.found.sites

    @cached_property
    def scopes(self):
        return self.wrapper.resolve(ScopeProvider)

    @cached_property
    def _positions(self):
        # only files with suppression comments ask: PositionProvider costs a code generation
        return self.wrapper.resolve(PositionProvider)

    def first_line(self, node: cst.CSTNode) -> int:
        """The line ``node``'s own text starts on."""
        return self._positions[node].start.line

    @cached_property
    def plain(self) -> frozenset[str]:
        """Names whose reads need no scope analysis (``plain_names``)."""
        if self.source is None:
            return frozenset()
        found = PlainNames.of(self.source)
        return found.names if found is not None else frozenset()

    @cached_property
    def _plain_imports(self) -> dict[str, PlainImport]:
        out = {}
        for site in self.sites:
            if not site.module_scope or isinstance(site.node.names, cst.ImportStar):
                continue
            for alias in site.node.names:
                bound = alias_binding(alias)
                if bound in self.plain:
                    reads = [PlainRead(n) for n in self.found.loads.get(bound, ())]
                    out[bound] = PlainImport(bound, site.node, reads)
        return out

    def referents_of(self, expr: cst.CSTNode) -> Sequence | None:
        """The assignments a name access may read (None: ``expr`` is no access), from
        the plain names when it is one of them, else from the scope analysis."""
        if isinstance(expr, cst.Name) and expr.value in self.plain:
            found = self._plain_imports.get(expr.value)
            if found is not None:
                return [found]
        return self.referents.get(expr)

    def only_binding(self, site: ImportSite, name: str, own_scope: bool = False) -> bool:
        """Whether ``name`` has exactly one assignment in ``site``'s scope (``own_scope``)
        or as seen from there (by default)."""
        plain = self._plain_imports.get(name) if name in self.plain else None
        if plain is not None and plain.node is site.node:
            return True
        scope = self.scopes.get(site.node)
        if scope is None:
            return False
        return len(list(scope.assignments[name] if own_scope else scope[name])) == 1

    @cached_property
    def referents(self) -> dict[cst.CSTNode, Sequence]:
        """Each name access -> the assignments it may read."""
        out: dict[cst.CSTNode, Sequence] = {}
        for scope in {s for s in self.scopes.values() if s is not None}:
            for access in scope.accesses:
                out[access.node] = list(access.referents)
        return out

    @cached_property
    def _sites_by_node(self) -> dict[cst.CSTNode, ImportSite]:
        return {site.node: site for site in self.sites}

    def site_of(self, node: cst.CSTNode) -> ImportSite | None:
        return self._sites_by_node.get(node)

    @cached_property
    def binds_old_module(self) -> bool:
        """Whether any import could bind the old module object (or a package above it).
        Without one no expression can evaluate to it, so scope analysis is skipped."""
        for site in self.sites:
            node = site.node
            if isinstance(node, cst.Import):
                if any(may_bind(self.old, dotted_name(a.name) or "") for a in node.names):
                    return True
            elif site.module and not isinstance(node.names, cst.ImportStar):
                if any(isinstance(a.name, cst.Name) and may_bind(self.old, a.name.value, site.module)
                       for a in node.names):
                    return True
        return False
