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
from .resolve import dotted_name, may_bind


@dataclass(frozen=True, eq=False)
class FileFacts:
    module: cst.Module
    wrapper: MetadataWrapper
    map: MoveMap
    package: str | None
    path: str
    found: Collected

    @classmethod
    def read(cls, module: cst.Module, move_map: MoveMap, package: str | None, path: str) -> FileFacts:
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        found = collect(wrapper.module, package, move_map.interesting, move_map.new_module)
        return cls(wrapper.module, wrapper, move_map, package, path, found)

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
