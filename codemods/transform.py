"""The transform: one libcst pass per file applies the whole move map.

``migrate_source`` is the engine (what the CLI runs in its worker processes);
``MoveImportsCommand`` (defined in ``command.py``, importable from here as well)
exposes the same engine to ``python -m libcst.tool codemod``.

A file goes through three steps:

1. *collect* - one visit records import statements (with the block they sit in and
   any try/except around them), attribute uses of names that moved, calls that patch
   or look up names dynamically, string literals, ``__all__`` and every name in use;
2. *plan* - decide every edit and finding; names are resolved by what they are bound
   to (scope analysis, computed only when a module object or a rebound global is
   involved), relative imports against the file's package;
3. *apply* - one transformer swaps the planned nodes; nothing else is regenerated, so
   bytes outside edited lines stay as they were.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider
from libcst.metadata.scope_provider import ImportAssignment

from .findings import Finding
from .imports import (
    alias_binding,
    module_binding_import,
    retarget,
    with_aliases,
)
from .move_map import MoveMap
from .positions import start_positions
from .relevance import Gate
from .resolve import absolute_module, dotted_expr, dotted_name, parent_and_base

_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_PRAGMA = re.compile(r"#\s*(noqa|type:\s*ignore|pragma|pyright:|mypy:|isort:)")


@dataclass(eq=False)
class _Site:
    """One import statement and where it sits."""

    node: cst.Import | cst.ImportFrom
    line: cst.SimpleStatementLine | cst.SimpleStatementSuite
    block: cst.CSTNode  # owner of the statement list (Module, IndentedBlock or suite)
    index: int  # position of ``line`` in ``block``
    module: str | None  # absolute module of a from-import
    try_ctx: tuple[cst.CSTNode, str] | None  # (Try node, "body" | "handler" | "other")


@dataclass(eq=False)
class _Call:
    kind: str
    node: cst.Call


class _Collector(cst.CSTVisitor):
    def __init__(self, engine: _FileMigration) -> None:
        super().__init__()
        self.e = engine
        self._blocks: list[list] = []  # [owner, next index]
        self._line: cst.CSTNode | None = None
        self._line_index = 0
        self._tries: list[tuple[cst.CSTNode, str]] = []
        self._try_tails: dict[cst.CSTNode, cst.CSTNode] = {}
        self._depth = 0  # function/class nesting; __all__ counts only at module level

    # statement containers -------------------------------------------------------
    def _enter_block(self, node: cst.CSTNode) -> None:
        self._blocks.append([node, 0])

    def visit_Module(self, node: cst.Module) -> None:
        self._enter_block(node)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._enter_block(node)

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.pop()

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._line, self._line_index = node, 0

    def leave_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._line = None

    def _count_statement(self) -> int:
        if not self._blocks:
            return 0
        top = self._blocks[-1]
        top[1] += 1
        return top[1] - 1

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._line_index = self._count_statement()
        self._line = node

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._line = None

    def visit_If(self, node: cst.If) -> None:
        self._count_statement()

    def _compound(self, node: cst.CSTNode) -> None:
        self._count_statement()

    visit_For = visit_While = visit_With = visit_Match = _compound

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._count_statement()
        self._depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._count_statement()
        self._depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._depth -= 1

    # try / except ---------------------------------------------------------------
    def visit_Try(self, node: cst.Try) -> None:
        self._count_statement()
        self._tries.append((node, "body"))
        for tail in (node.orelse, node.finalbody):
            if tail is not None:
                self._try_tails[tail] = node

    def leave_Try(self, node: cst.Try) -> None:
        self._tries.pop()

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._tries.append((self._tries[-1][0], "handler" if _catches_import_error(node) else "other"))

    def leave_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._tries.pop()

    def visit_Else(self, node: cst.Else) -> None:
        if node in self._try_tails:
            self._tries.append((self._try_tails[node], "other"))

    def leave_Else(self, node: cst.Else) -> None:
        if node in self._try_tails:
            self._tries.pop()

    def visit_Finally(self, node: cst.Finally) -> None:
        self._tries.append((self._try_tails.get(node, node), "other"))

    def leave_Finally(self, node: cst.Finally) -> None:
        self._tries.pop()

    # imports --------------------------------------------------------------------
    def _site(self, node: cst.Import | cst.ImportFrom, module: str | None) -> None:
        block = self._blocks[-1][0] if self._line is not None and not isinstance(
            self._line, cst.SimpleStatementSuite
        ) else self._line
        site = _Site(
            node=node,
            line=self._line,
            block=block,
            index=self._line_index,
            module=module,
            try_ctx=self._tries[-1] if self._tries else None,
        )
        self.e.sites.append(site)
        for alias in node.names if not isinstance(node.names, cst.ImportStar) else ():
            bound = alias_binding(alias)
            if bound:
                self.e.names_seen.add(bound)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        module = absolute_module(
            self.e.package, len(node.relative), dotted_name(node.module) if node.module else None
        )
        self._site(node, module)
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        self._site(node, None)
        for alias in node.names:
            name = dotted_name(alias.name)
            if name:
                self.e.names_seen.add(name.split(".")[0])
        return False

    # uses -----------------------------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        self.e.names_seen.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.e.attr_words.add(node.attr.value)
        if node.attr.value in self.e.interesting:
            self.e.attributes.append(node)

    def _stores(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Attribute):
            self.e.stores.add(target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._stores(element.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._stores(target.target)
            if self._depth == 0 and _is_name(target.target, "__all__"):
                self._all_entries(node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._stores(node.target)
        if self._depth == 0 and _is_name(node.target, "__all__"):
            self._all_entries(node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._stores(node.target)
        if self._depth == 0 and _is_name(node.target, "__all__") and node.value is not None:
            self._all_entries(node.value)

    def visit_Del(self, node: cst.Del) -> None:
        self._stores(node.target)

    def _all_entries(self, value: cst.BaseExpression) -> None:
        if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
            for element in value.elements:
                text = _literal(element.value)
                if text is not None:
                    self.e.all_names.add(text)

    def visit_Expr(self, node: cst.Expr) -> None:
        if isinstance(node.value, (cst.SimpleString, cst.ConcatenatedString)):
            self.e.docstrings.add(node.value)
            if isinstance(node.value, cst.ConcatenatedString):
                self.e.docstrings.update(_parts(node.value))

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        self.e.strings.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted_name(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        kind = None
        if name in ("setattr", "delattr"):
            kind = "setattr"
        elif name in ("getattr", "hasattr"):
            kind = "getattr"
        elif last in ("import_module", "__import__"):
            kind = "import"
        elif last == "patch":
            kind = "patch"
        elif name.endswith("patch.object"):
            kind = "object"
        elif name.endswith("patch.multiple"):
            kind = "multiple"
        elif last in ("setattr", "delattr"):
            kind = "monkeypatch"
        elif self._depth == 0 and name in ("__all__.extend", "__all__.append") and node.args:
            value = node.args[0].value
            text = _literal(value)
            if text is not None:
                self.e.all_names.add(text)
            else:
                self._all_entries(value)
        if kind:
            self.e.calls.append(_Call(kind, node))


def _is_name(node: cst.CSTNode, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def _parts(node: cst.ConcatenatedString) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = []
    for side in (node.left, node.right):
        if isinstance(side, cst.ConcatenatedString):
            out.extend(_parts(side))
        else:
            out.append(side)
    return out


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    for kind in kinds:
        expr = kind.value if isinstance(kind, cst.Element) else kind
        name = dotted_name(expr) or ""
        if name.rsplit(".", 1)[-1] in _IMPORT_ERRORS:
            return True
    return False


def _literal(node: cst.CSTNode) -> str | None:
    """The text of a plain string literal (no bytes, no f-string), else None."""
    if not isinstance(node, cst.SimpleString):
        return None
    if "b" in node.prefix.lower():
        return None
    try:
        value = node.evaluated_value
    except Exception:  # pragma: no cover - libcst validated the literal already
        return None
    return value if isinstance(value, str) else None


def _with_literal(node: cst.SimpleString, text: str) -> cst.SimpleString | None:
    """``node`` holding ``text``, same prefix and quotes; None if it has escapes."""
    body = node.value[len(node.prefix) + len(node.quote) : -len(node.quote)]
    if body != node.evaluated_value or "\\" in text or node.quote in text:
        return None
    return node.with_changes(value=f"{node.prefix}{node.quote}{text}{node.quote}")


@dataclass
class FileOutcome:
    """What the engine did to one source: new bytes (None: unchanged) and findings."""

    new_source: bytes | None
    findings: list[Finding] = field(default_factory=list)


class _FileMigration:
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
        # collected
        self.sites: list[_Site] = []
        self.names_seen: set[str] = set()
        self.attr_words: set[str] = set()
        self.attributes: list[cst.Attribute] = []
        self.stores: set[cst.CSTNode] = set()
        self.all_names: set[str] = set()
        self.docstrings: set[cst.CSTNode] = set()
        self.strings: list[cst.SimpleString] = []
        self.calls: list[_Call] = []
        # planned
        self.current: dict[cst.CSTNode, cst.CSTNode] = {}
        self.current_module: dict[cst.CSTNode, str] = {}
        self.after: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = {}
        self.deleted: set[cst.CSTNode] = set()
        self.expr: dict[cst.CSTNode, cst.CSTNode] = {}
        self.handled_strings: set[cst.CSTNode] = set()
        self.raw: list[tuple[cst.CSTNode, str, str, str, bool]] = []
        self._scopes = None
        self._referents: dict[cst.CSTNode, Sequence] | None = None
        self._module_refs: dict[tuple, str] = {}
        self._skip_sites: set[int] = set()
        self._fresh: set[str] = set()  # module bindings this run added
        self._added: list[tuple[cst.CSTNode, int, str, str]] = []  # (block, index, module, ref)
        self.after_bindings: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = {}
        # module-object bindings of the old module whose uses were rewritten
        self._touched: dict[int, tuple[object, _Site]] = {}
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

    def _site_of(self, node: cst.CSTNode) -> _Site | None:
        return next((s for s in self.sites if s.node is node), None)

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

    # -- run ------------------------------------------------------------------------
    def run(self) -> tuple[cst.Module, list[Finding]]:
        self.module.visit(_Collector(self))
        self.plan_from_imports()
        self.plan_module_attributes()
        self.plan_calls()
        self.plan_star_imports()
        self.plan_dynamic_strings()
        self.prune_unused_module_bindings()
        new_module = self.module
        if self.expr or self.current or self.after or self.after_bindings or self.deleted:
            new_module = self.module.visit(_Apply(self))
        positions = start_positions(self.module, [r[0] for r in self.raw])
        findings = []
        for node, code, symbol, message, fixed in self.raw:
            line, column = positions.get(node, (1, 1))
            findings.append(Finding(self.path, line, column, code, symbol, message, fixed))
        findings.sort(key=lambda f: (f.line, f.column, f.code))
        return new_module, findings

    # -- from-imports -----------------------------------------------------------------
    def _is_compatible_shim(self, site: _Site, moving: list[tuple[cst.ImportAlias, str]]) -> bool:
        """``try: from new import x`` / ``except ImportError: from old import x``: leave it."""
        if site.try_ctx is None or site.try_ctx[1] == "other":
            return False
        try_node, side = site.try_ctx
        others = [
            s for s in self.sites
            if s.try_ctx is not None and s.try_ctx[0] is try_node and s.try_ctx[1] not in (side, "other")
            and isinstance(s.node, cst.ImportFrom)
        ]
        if not others:
            return False
        for alias, dest in moving:
            bound = alias_binding(alias)
            if not any(
                s.module == dest and not isinstance(s.node.names, cst.ImportStar)
                and any(alias_binding(a) == bound for a in s.node.names)
                for s in others
            ):
                return False
        return True

    def plan_from_imports(self) -> None:
        rebound = self.map.rebound_globals
        for site in list(self.sites):
            node = site.node
            if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
                continue
            if site.module == self.new and rebound:
                removed = {
                    id(alias) for alias in node.names
                    if isinstance(alias.name, cst.Name) and alias.name.value in rebound
                    and self._plan_rebound(site, alias)
                }
                if removed:
                    self._split(site, [], removed)
                continue
            if site.module != self.old:
                continue
            moving: list[tuple[cst.ImportAlias, str]] = []
            for alias in node.names:
                name = alias.name.value if isinstance(alias.name, cst.Name) else None
                dest = self.map.destination(name) if name else None
                if dest:
                    moving.append((alias, dest))
                elif name in self.gone:
                    self.report_gone(alias, name)
            if not moving or self._is_compatible_shim(site, moving):
                if moving:
                    self._skip_sites.add(id(site))
                continue
            removed: set[int] = set()
            for alias, _dest in moving:
                if alias.name.value in rebound and self._plan_rebound(site, alias):
                    removed.add(id(alias))
            self._split(site, [(a, d) for a, d in moving if id(a) not in removed], removed)

    def _split(self, site: _Site, moving: list[tuple[cst.ImportAlias, str]], removed: set[int]) -> None:
        node = site.node
        assert isinstance(node, cst.ImportFrom)
        moving_ids = {id(a) for a, _ in moving}
        staying = [a for a in self._current(node).names if id(a) not in moving_ids | removed]
        groups: dict[str, list[cst.ImportAlias]] = {}
        for alias, dest in moving:
            groups.setdefault(dest, []).append(alias)
            self.report_move(alias, alias.name.value, dest, "import")
        if not groups:
            if removed:
                if staying:
                    self.current[node] = with_aliases(self._current(node), [(a, None) for a in staying])
                else:
                    self.deleted.add(node)
            return
        order = list(groups)
        if not staying:
            first = order.pop(0)
            target = self._merge_target(site, first)
            if target is not None and self._removable(site):
                self._merge_into(target, groups[first], node)
                self.deleted.add(node)
            else:
                current = self._current(node)
                if removed or order:
                    current = with_aliases(current, [(a, None) for a in groups[first]])
                self.current[node] = retarget(current, first, self.package)
                self.current_module[node] = first
        else:
            self.current[node] = with_aliases(self._current(node), [(a, None) for a in staying])
        for dest in order:
            target = self._merge_target(site, dest)
            if target is not None:
                self._merge_into(target, groups[dest], node)
            else:
                statement = retarget(
                    with_aliases(node, [(a, None) for a in groups[dest]]), dest, self.package
                )
                self.after.setdefault(node, []).append(statement)

    def _current(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.current.get(node, node)

    def _removable(self, site: _Site) -> bool:
        """A statement may be merged away only if that loses no comment or neighbour."""
        line = site.line
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return False
        if line.trailing_whitespace.comment is not None:
            return False
        if any(e.comment is not None for e in line.leading_lines):
            return False
        node = site.node
        return not any(
            isinstance(a.comma, cst.Comma)
            and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
            and (a.comma.whitespace_after.first_line.comment is not None
                 or any(e.comment for e in a.comma.whitespace_after.empty_lines))
            for a in node.names
        ) and not (
            node.rpar is not None
            and isinstance(node.rpar.whitespace_before, cst.ParenthesizedWhitespace)
            and node.rpar.whitespace_before.first_line.comment is not None
        )

    def _merge_target(self, site: _Site, dest: str) -> _Site | None:
        """An earlier ``from dest import ...`` in the same block, to add names to."""
        best = None
        for other in self.sites:
            if (
                other is site
                or other.block is not site.block
                or other.index >= site.index
                or not isinstance(other.node, cst.ImportFrom)
                or isinstance(other.node.names, cst.ImportStar)
                or other.node in self.deleted
                or id(other) in self._skip_sites
            ):
                continue
            if self.current_module.get(other.node, other.module) == dest:
                best = other
        return best

    def _merge_into(self, target: _Site, aliases: list[cst.ImportAlias], source: cst.ImportFrom) -> None:
        current = self._current(target.node)
        present = {(a.name.value, alias_binding(a)) for a in current.names if isinstance(a.name, cst.Name)}
        entries = [(a, None) for a in current.names]
        for alias in aliases:
            key = (alias.name.value, alias_binding(alias))
            if key not in present:
                entries.append((alias, source))
                present.add(key)
        if len(entries) > len(current.names):
            self.current[target.node] = with_aliases(current, entries)

    # -- rebound globals ----------------------------------------------------------------
    def _plan_rebound(self, site: _Site, alias: cst.ImportAlias) -> bool:
        """Flag a from-import of a rebound global; rewrite its uses to module attribute
        access when that is safe. Returns True when the alias was taken out."""
        name = alias.name.value
        bound = alias_binding(alias)
        reason = self._rebound_unsafe(site, bound)
        where = f"{self.new}.{name}"
        if reason is None:
            ref = self.module_ref(site, self.new)
            assignment = self._assignment_for(site, bound)
            for access in assignment.references:
                use = access.node
                self.expr[use] = cst.Attribute(
                    value=dotted_expr(ref), attr=cst.Name(name), lpar=use.lpar, rpar=use.rpar
                )
            self.report(alias, "MMS004", name,
                        f"{name!r} is rebound at run time; a from-import keeps a stale value. "
                        f"Uses now read {ref}.{name}", True)
            return True
        self.report(alias, "MMS004", name,
                    f"{name!r} is rebound at run time; a from-import keeps a stale value. "
                    f"Read it as {where} instead (not rewritten: {reason})", False)
        return False

    def _assignment_for(self, site: _Site, bound: str):
        scope = self.scopes.get(site.node)
        if scope is None:
            return None
        found = [a for a in scope.assignments[bound]]
        for assignment in found:
            if isinstance(assignment, ImportAssignment) and assignment.node is site.node:
                return assignment
        return None

    def _rebound_unsafe(self, site: _Site, bound: str | None) -> str | None:
        if bound is None:
            return "unusual alias"
        scope = self.scopes.get(site.node)
        assignment = self._assignment_for(site, bound)
        if scope is None or assignment is None:
            return "binding not found"
        if len(list(scope.assignments[bound])) != 1:
            return f"{bound!r} is bound more than once in this scope"
        if bound in self.all_names and site.block is self.module:
            return f"{bound!r} is listed in __all__"
        references = list(assignment.references)
        if not references:
            return "no use in this file (a re-export keeps the stale value for importers)"
        if not all(isinstance(r.node, cst.Name) for r in references):
            return "a use is not a plain name"
        return None

    # -- module bindings ------------------------------------------------------------------
    def _free_name(self, base: str) -> str:
        name, k = base, 1
        while name in self.names_seen:
            name, k = f"{base}_{k}", k + 1
        self.names_seen.add(name)
        return name

    def _single_binding(self, site: _Site, name: str) -> bool:
        scope = self.scopes.get(site.node)
        return scope is not None and len(list(scope[name])) == 1

    def module_ref(self, site: _Site, dest: str) -> str:
        """A dotted expression that reaches module ``dest`` wherever ``site``'s bindings
        are visible: an existing binding in the same block, or one added next to ``site``."""
        dotted_style = isinstance(site.node, cst.Import) and all(a.asname is None for a in site.node.names)
        key = (id(site.block), site.index, dest, dotted_style)
        if key in self._module_refs:
            return self._module_refs[key]
        parent, base = parent_and_base(dest)
        ref = None
        for other in self.sites:
            if other.block is not site.block or other.index > site.index or other.node in self.deleted:
                continue
            node = self._current(other.node)
            if isinstance(node, cst.Import):
                for alias in node.names:
                    if dotted_name(alias.name) != dest:
                        continue
                    if alias.asname is None and self._single_binding(other, dest.split(".")[0]):
                        ref = dest
                    elif alias.asname is not None and self._single_binding(other, alias_binding(alias)):
                        ref = alias_binding(alias)
            elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
                if self.current_module.get(other.node, other.module) != parent:
                    continue
                for alias in node.names:
                    if isinstance(alias.name, cst.Name) and alias.name.value == base:
                        bound = alias_binding(alias)
                        if bound and bound not in self._fresh and self._single_binding(other, bound):
                            ref = bound
                        elif bound in self._fresh:
                            ref = bound
            if ref:
                break
        if ref is None:
            ref = next(
                (r for block, index, module, r in self._added
                 if block is site.block and index <= site.index and module == dest
                 and (r == dest) == dotted_style),
                None,
            )
        if ref is None:
            ref = self._add_binding(site, dest, dotted_style)
            self._added.append((site.block, site.index, dest, ref))
        self._module_refs[key] = ref
        return ref

    def _add_binding(self, site: _Site, dest: str, dotted_style: bool) -> str:
        parent, base = parent_and_base(dest)
        node = site.node
        if dotted_style:
            self.after_bindings.setdefault(node, []).append(
                cst.Import(names=[cst.ImportAlias(name=dotted_expr(dest))])
            )
            return dest
        name = self._free_name(base)
        self._fresh.add(name)
        current = self._current(node)
        if (
            isinstance(current, cst.ImportFrom)
            and not isinstance(current.names, cst.ImportStar)
            and self.current_module.get(node, site.module) == parent
            and node not in self.deleted
        ):
            alias = cst.ImportAlias(
                name=cst.Name(base), asname=cst.AsName(name=cst.Name(name)) if name != base else None
            )
            holder = cst.ImportFrom(module=cst.Name("_"), names=[alias])
            self.current[node] = with_aliases(
                current, [(a, None) for a in current.names] + [(alias, holder)]
            )
            return name
        self.after_bindings.setdefault(node, []).append(
            module_binding_import(dest, name, current, self.package)
        )
        return name

    # -- attribute uses of the old module object ---------------------------------------------
    def _assignment_module(self, assignment) -> str | None:
        if not isinstance(assignment, ImportAssignment):
            return None
        node = assignment.node
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted_name(alias.name) or ""
                if alias.asname is not None:
                    if alias_binding(alias) == assignment.name:
                        return full
                elif full == assignment.name or full.startswith(assignment.name + "."):
                    return assignment.name
            return None
        if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            site = self._site_of(node)
            module = site.module if site else None
            if module is None:
                return None
            for alias in node.names:
                if alias_binding(alias) == assignment.name and isinstance(alias.name, cst.Name):
                    return f"{module}.{alias.name.value}"
        return None

    def resolve_module(self, expr: cst.BaseExpression):
        """(dotted module the expression evaluates to, import assignments) or (None, ())."""
        refs = self.referents.get(expr)
        if refs is not None:
            paths = {self._assignment_module(a) for a in refs}
            if len(paths) == 1 and None not in paths and refs:
                return paths.pop(), refs
            return None, ()
        if isinstance(expr, cst.Attribute):
            base, refs = self.resolve_module(expr.value)
            if base is not None:
                return f"{base}.{expr.attr.value}", refs
        return None, ()

    def _binds_old_module(self) -> bool:
        old_prefixes = set()
        parts = self.old.split(".")
        for i in range(len(parts)):
            old_prefixes.add(".".join(parts[: i + 1]))
        for site in self.sites:
            node = site.node
            if isinstance(node, cst.Import):
                if any((dotted_name(a.name) or "") in old_prefixes
                       or (dotted_name(a.name) or "").startswith(self.old + ".")
                       for a in node.names):
                    return True
            elif site.module and not isinstance(node.names, cst.ImportStar):
                if any(isinstance(a.name, cst.Name) and f"{site.module}.{a.name.value}" in old_prefixes
                       for a in node.names):
                    return True
        return False

    def plan_module_attributes(self) -> None:
        if not self.attributes or not self._binds_old_module():
            return
        uses: dict[int, list[tuple[cst.Attribute, str, str]]] = {}
        assignments: dict[int, object] = {}
        for attribute in self.attributes:
            module, refs = self.resolve_module(attribute.value)
            if module != self.old:
                continue
            name = attribute.attr.value
            if name in self.gone:
                self.report_gone(attribute, name)
                continue
            if attribute in self.stores:
                self._old_site_write(attribute, name, attribute.value, refs, "assignment")
                continue
            if len(refs) != 1:
                first = self._earliest_binding(refs)
                if first is None:
                    self.report(attribute, "MMS007", name,
                                f"{name!r} is reached through a name bound to {self.old} in "
                                "several blocks; not rewritten", False)
                    continue
                refs = [first]
            uses.setdefault(id(refs[0]), []).append((attribute, name, self.map.destination(name)))
            assignments[id(refs[0])] = refs[0]
        for key, group in uses.items():
            assignment = assignments[key]
            site = self._site_of(assignment.node)
            if site is None:
                continue
            if not self._move_binding_whole(site, assignment, group):
                for attribute, _name, dest in group:
                    ref = self.module_ref(site, dest)
                    self.expr[attribute] = attribute.with_changes(value=dotted_expr(ref))
                    self._rewritten_uses.add(id(attribute.value))
                self._touched[key] = (assignment, site)
            for attribute, name, dest in group:
                self.report_move(attribute, name, dest, "attribute")

    def _earliest_binding(self, refs):
        """Of several imports binding the old module to one name in one block, the first:
        a binding added next to it is visible wherever any of them is."""
        sites = [self._site_of(r.node) for r in refs]
        if any(s is None for s in sites) or len({id(s.block) for s in sites}) != 1:
            return None
        return min(zip(sites, refs), key=lambda pair: pair[0].index)[1]

    def _move_binding_whole(self, site: _Site, assignment, group) -> bool:
        """All uses of the binding moved to one module: retarget the import itself."""
        dests = {dest for _, _, dest in group}
        if len(dests) != 1 or id(site) in self._skip_sites:
            return False
        dest = dests.pop()
        scope = self.scopes.get(site.node)
        if scope is None or len(list(scope.assignments[assignment.name])) != 1:
            return False
        used = {id(attribute.value) for attribute, _, _ in group}
        references = list(assignment.references)
        if not references or any(id(r.node) not in used for r in references):
            return False
        if assignment.name in self.all_names and site.block is self.module:
            return False
        node = self._current(site.node)
        parent, base = parent_and_base(dest)
        if isinstance(node, cst.ImportFrom):
            if self.current_module.get(site.node, site.module) != parent:
                return False
            for i, alias in enumerate(node.names):
                if alias_binding(alias) != assignment.name or not isinstance(alias.name, cst.Name):
                    continue
                rename = alias.asname is None
                if rename and base in self.names_seen:
                    return False
                names = list(node.names)
                names[i] = alias.with_changes(name=cst.Name(base))
                self.current[site.node] = node.with_changes(names=names)
                if rename:
                    self.names_seen.add(base)
                    for attribute, _, _ in group:
                        self.expr[attribute] = attribute.with_changes(value=cst.Name(base))
                return True
            return False
        for i, alias in enumerate(node.names):
            full = dotted_name(alias.name)
            if full != self.old:
                continue
            if alias.asname is None and assignment.name != self.old:
                return False
            names = list(node.names)
            names[i] = alias.with_changes(name=dotted_expr(dest))
            self.current[site.node] = node.with_changes(names=names)
            if alias.asname is None:
                for attribute, _, _ in group:
                    self.expr[attribute] = attribute.with_changes(value=dotted_expr(dest))
            return True
        return False

    def prune_unused_module_bindings(self) -> None:
        """Drop an import of the old module whose every use was rewritten (it would be
        left unused); one that still has a use, or feeds ``__all__``, stays."""
        for assignment, site in self._touched.values():
            if site.node in self.deleted or id(site) in self._skip_sites:
                continue
            references = list(assignment.references)
            if not references or any(id(r.node) not in self._rewritten_uses for r in references):
                continue
            if assignment.name in self.all_names and site.block is self.module:
                continue
            node = self._current(site.node)
            if isinstance(node, cst.Import) and any(a.asname is None for a in node.names):
                continue  # ``import a.b.c`` also binds ``a`` for other uses
            keep = [a for a in node.names if alias_binding(a) != assignment.name]
            if len(keep) == len(node.names):
                continue
            if keep:
                self.current[site.node] = (
                    with_aliases(node, [(a, None) for a in keep])
                    if isinstance(node, cst.ImportFrom)
                    else node.with_changes(names=[*keep[:-1], keep[-1].with_changes(
                        comma=cst.MaybeSentinel.DEFAULT)])
                )
            elif site.node in self.after_bindings or site.node in self.after:
                self.deleted.add(site.node)

    def _old_site_write(self, node, name: str, obj, refs, how: str) -> None:
        """A patch or assignment of ``old.name``: moved-only names are retargeted,
        re-exported and import-only names reported (old and new site differ)."""
        moved = name in self.map.moved
        if moved and name not in self.map.reexported:
            if obj is None:
                return
            site = self._site_of(refs[0].node) if len(refs) == 1 else None
            if site is None:
                self.report(node, "MMS005", name, f"{how} of {self.old}.{name}: {name!r} now lives "
                            f"in {self.new}; patch it there (binding not resolvable)", False)
                return
            self.expr[obj] = dotted_expr(self.module_ref(site, self.new))
            self._rewritten_uses.add(id(obj))
            self._touched[id(refs[0])] = (refs[0], site)
            self.report_move(node, name, self.new, how)
            return
        if moved:
            message = (f"{how} of {self.old}.{name}: the re-export still resolves, but code in "
                       f"{self.new} looks {name!r} up there; patch {self.new}.{name} (and "
                       f"{self.old}.{name} only for callers left in {self.old})")
        else:
            message = (f"{how} of {self.old}.{name}: {self.old} no longer binds {name!r}; patch it "
                       f"where the code that uses it looks it up (probably {self.new})")
        self.report(node, "MMS005", name, message, False)

    # -- calls ----------------------------------------------------------------------------
    def _arg(self, call: cst.Call, position: int, keyword: str | None = None):
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if keyword:
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value == keyword:
                    return arg.value
        if position < len(positional):
            return positional[position].value
        return None

    def plan_calls(self) -> None:
        for call in self.calls:
            node = call.node
            if call.kind == "patch":
                self._string_target(self._arg(node, 0, "target"), node)
            elif call.kind == "monkeypatch":
                first = self._arg(node, 0, "target")
                if isinstance(first, cst.SimpleString) and "." in (_literal(first) or ""):
                    self._string_target(first, node)
                else:
                    self._object_target(node, first, self._arg(node, 1, "name"), "patch")
            elif call.kind == "object":
                self._object_target(node, self._arg(node, 0, "target"),
                                    self._arg(node, 1, "attribute"), "patch")
            elif call.kind == "setattr":
                self._object_target(node, self._arg(node, 0), self._arg(node, 1), "setattr")
            elif call.kind == "multiple":
                self._multiple(node)
            elif call.kind == "getattr":
                self._dynamic_lookup(node)
            elif call.kind == "import":
                self._dynamic_import(node)

    def _string_target(self, string, call: cst.Call) -> None:
        text = _literal(string) if string is not None else None
        if text is None or not text.startswith(self.old + "."):
            return
        self.handled_strings.add(string)
        name = text[len(self.old) + 1 :].split(".")[0]
        if name not in self.interesting:
            return
        if name in self.map.moved and name not in self.map.reexported:
            replacement = _with_literal(string, self.new + text[len(self.old) :])
            if replacement is None:
                self.report(string, "MMS007", name, f"patch target {text!r}: {name!r} moved to "
                            f"{self.new}; string has escapes, not rewritten", False)
                return
            self.expr[string] = replacement
            self.report_move(string, name, self.new, "patch target")
            return
        self._old_site_write(string, name, None, (), "patch")

    def _object_target(self, call: cst.Call, obj, attribute, how: str) -> None:
        name = _literal(attribute) if attribute is not None else None
        if obj is None or name is None or name not in self.interesting:
            return
        if not self._binds_old_module():
            return
        module, refs = self.resolve_module(obj)
        if module != self.old:
            return
        self.handled_strings.add(attribute)
        self._old_site_write(call, name, obj, refs, how)

    def _multiple(self, call: cst.Call) -> None:
        target = self._arg(call, 0, "target")
        names = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value != "target"]
        hits = [n for n in names if n in self.interesting]
        if target is None or not hits:
            return
        text = _literal(target)
        if text is not None:
            if text != self.old:
                return
            self.handled_strings.add(target)
            refs = ()
        else:
            if not self._binds_old_module():
                return
            module, refs = self.resolve_module(target)
            if module != self.old:
                return
        if all(n in self.map.moved and n not in self.map.reexported for n in names):
            if text is not None:
                replacement = _with_literal(target, self.new)
                if replacement is not None:
                    self.expr[target] = replacement
                    for n in hits:
                        self.report_move(call, n, self.new, "patch.multiple")
                    return
            elif len(refs) == 1 and self._site_of(refs[0].node) is not None:
                site = self._site_of(refs[0].node)
                self.expr[target] = dotted_expr(self.module_ref(site, self.new))
                self._rewritten_uses.add(id(target))
                self._touched[id(refs[0])] = (refs[0], site)
                for n in hits:
                    self.report_move(call, n, self.new, "patch.multiple")
                return
        self.report(call, "MMS005", ",".join(hits),
                    f"patch.multiple on {self.old} names {', '.join(hits)}: they do not all live in "
                    f"{self.new} only; split the patch by module", False)

    def _dynamic_lookup(self, call: cst.Call) -> None:
        obj, attribute = self._arg(call, 0), self._arg(call, 1)
        name = _literal(attribute) if attribute is not None else None
        if obj is None or name not in self.interesting or not self._binds_old_module():
            return
        module, _ = self.resolve_module(obj)
        if module != self.old:
            return
        self.handled_strings.add(attribute)
        self.report(call, "MMS007", name, f"dynamic lookup of {name!r} on {self.old}; it moved to "
                    f"{self.map.destination(name)}; not rewritten", False)

    def _dynamic_import(self, call: cst.Call) -> None:
        target = self._arg(call, 0, "name")
        if _literal(target) != self.old:
            return
        self.handled_strings.add(target)
        used = sorted(self.interesting & (self.attr_words | {(_literal(s) or "") for s in self.strings}))
        if used:
            self.report(call, "MMS007", ",".join(used),
                        f"{self.old} imported dynamically and {', '.join(used)} used in this file; "
                        f"those moved (to {self.new} or their origin); not rewritten", False)

    # -- star imports, strings ----------------------------------------------------------------
    def plan_star_imports(self) -> None:
        stars = [
            s for s in self.sites
            if isinstance(s.node, cst.ImportFrom) and isinstance(s.node.names, cst.ImportStar)
            and s.module == self.old
        ]
        if not stars:
            return
        relied = set(self.all_names & self.interesting)
        if self.interesting & self.names_seen:
            for node, refs in self.referents.items():
                if isinstance(node, cst.Name) and node.value in self.interesting and not refs:
                    relied.add(node.value)
        if not relied:
            return
        names = sorted(relied)
        for site in stars:
            self.report(site.node, "MMS006", ",".join(names),
                        f"'from {self.old} import *' no longer provides {', '.join(names)}; "
                        "import them explicitly from their new home", False)

    def plan_dynamic_strings(self) -> None:
        gate = Gate.for_map(self.map)
        pattern = re.compile(re.escape(self.old) + r"\.(\w+)")
        for string in self.strings:
            if string in self.handled_strings or string in self.docstrings:
                continue
            text = _literal(string)
            if text is None:
                continue
            names = [m for m in pattern.findall(text) if m in self.interesting]
            if names:
                self.report(string, "MMS007", names[0],
                            f"string names {self.old}.{names[0]}, which moved to "
                            f"{self.map.destination(names[0])}; not rewritten", False)
            elif any(form in text for form in gate.path_forms):
                self.report(string, "MMS008", self.old,
                            f"file path of {self.old}; moved names now live in {self.new}; "
                            "not rewritten", False)


class _Apply(cst.CSTTransformer):
    def __init__(self, engine: _FileMigration) -> None:
        super().__init__()
        self.e = engine

    def _replacement(self, small: cst.CSTNode) -> list[cst.BaseSmallStatement] | None:
        e = self.e
        if not any(small in d for d in (e.current, e.after, e.after_bindings, e.deleted)):
            return None
        head = [] if small in e.deleted else [e.current.get(small, small)]
        return head + e.after.get(small, []) + e.after_bindings.get(small, [])

    def on_leave(self, original, updated):
        if original in self.e.expr:
            return self.e.expr[original]
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
        flat = self._flatten(original, updated)
        if flat is None:
            return updated
        if not flat:
            return cst.RemovalSentinel.REMOVE
        if len(original.body) > 1:
            return updated.with_changes(body=_joined(flat, updated.body))
        trailing = updated.trailing_whitespace
        extra = cst.TrailingWhitespace()
        if trailing.comment is not None and _PRAGMA.match(trailing.comment.value):
            extra = trailing
        lines = [updated.with_changes(body=[flat[0]])]
        for small in flat[1:]:
            lines.append(cst.SimpleStatementLine(body=[small], trailing_whitespace=extra))
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


# ---------------------------------------------------------------------------------------
# Entry points


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
