"""What importing a module binds at its top level, and what its functions rebind (by AST)."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ...errors import MoveMapError
from ..engine.resolve import relative_base
from .sources import Source


@dataclass
class Bindings:
    """What importing a module binds at its top level, and what its functions rebind."""

    defined: dict[str, str] = field(default_factory=dict)  # name -> kind
    # name -> (origin module, name there); origin name None for ``import pkg [as x]``.
    imported: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    import_text: dict[str, str] = field(default_factory=dict)  # name -> the binding statement
    star_imports: list[str] = field(default_factory=list)
    rebound_globals: set[str] = field(default_factory=set)

    def binds(self, name: str) -> bool:
        return name in self.defined or name in self.imported


def scan(source: Source) -> Bindings:
    try:
        tree = ast.parse(source.text, filename=source.origin)
    except SyntaxError as exc:
        raise MoveMapError(f"{source.origin}: cannot parse line {exc.lineno}: {exc.msg}") from exc
    out = Bindings()
    _scan_block(tree.body, source, out)
    out.rebound_globals = _rebound_globals(tree)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def resolve_import(node: ast.ImportFrom, package: str, where: str) -> str:
    if not node.level:
        return node.module or ""
    base = relative_base(package, node.level)
    if base is None:
        raise MoveMapError(f"{where}:{node.lineno}: relative import beyond the top-level package {package!r}")
    return ".".join(p for p in (base, node.module) if p)


def _scan_block(body: Sequence[ast.stmt], source: Source, out: Bindings) -> None:
    def define(name: str, kind: str) -> None:
        out.defined.setdefault(name, kind)

    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            define(stmt.name, "function")
        elif isinstance(stmt, ast.ClassDef):
            define(stmt.name, "class")
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                for name in _target_names(target):
                    define(name, "variable")
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            # A bare annotation (``x: int``) binds nothing.
            if getattr(stmt, "value", True) is not None:
                for name in _target_names(stmt.target):
                    define(name, "variable")
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bound = alias.asname or alias.name.split(".")[0]
                origin = alias.name if alias.asname else bound
                out.imported.setdefault(bound, (origin, None))
                out.import_text.setdefault(bound, ast.unparse(ast.Import(names=[alias])))
        elif isinstance(stmt, ast.ImportFrom):
            if stmt.module == "__future__":
                continue
            origin = resolve_import(stmt, source.package, source.origin)
            for alias in stmt.names:
                if alias.name == "*":
                    out.star_imports.append(origin)
                    continue
                bound = alias.asname or alias.name
                out.imported.setdefault(bound, (origin, alias.name))
                written = ast.ImportFrom(module=origin, names=[alias], level=0)
                out.import_text.setdefault(bound, ast.unparse(written))
        elif isinstance(stmt, ast.If):
            if not (_is_type_checking(stmt.test) or _is_main_guard(stmt.test)):
                _scan_block(stmt.body, source, out)
            _scan_block(stmt.orelse, source, out)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            for name in _target_names(stmt.target):
                define(name, "variable")
            _scan_block(stmt.body, source, out)
            _scan_block(stmt.orelse, source, out)
        elif isinstance(stmt, ast.While):
            _scan_block(stmt.body, source, out)
            _scan_block(stmt.orelse, source, out)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    for name in _target_names(item.optional_vars):
                        define(name, "variable")
            _scan_block(stmt.body, source, out)
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            _scan_block(stmt.body, source, out)
            for handler in stmt.handlers:
                _scan_block(handler.body, source, out)
            _scan_block(stmt.orelse, source, out)
            _scan_block(stmt.finalbody, source, out)
        elif isinstance(stmt, ast.Match):
            for case in stmt.cases:
                _scan_block(case.body, source, out)


_NEW_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _scope_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """Nodes of one function's own scope: nested functions, classes and lambdas excluded."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _NEW_SCOPES):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _rebound_globals(tree: ast.Module) -> set[str]:
    rebound: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(_scope_nodes(func))
        declared = {n for node in nodes if isinstance(node, ast.Global) for n in node.names}
        if not declared:
            continue
        assigned: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                assigned.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                assigned.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                assigned.add(node.name)
        rebound |= declared & assigned
    return rebound


