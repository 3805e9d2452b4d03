"""Names that need no scope analysis: bound once in the whole file, by a module-level
import, and never declared ``global``/``nonlocal``, deleted or named in a string that
may be a type (one libcst's scope analysis reads names in: in an annotation, in a
subscript, in the arguments of ``cast``, ``TypeVar`` or ``NewType``).

Every read of such a name is a read of that import, whatever scope it is in, so the
uses of the binding are simply the reads of the name (``collect`` lists them). That is
what libcst's scope analysis would say too, at a fraction of its cost: it is the
expensive part of a file's pass, and most files bind the old module this simply
(``from sglang.srt.managers import mm_utils``). A file with a star import or a
``match`` statement (whose patterns bind names in ways not counted here) has none.
Found from the CPython ``ast`` of the file, in one walk.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_TYPE_CALLS = frozenset({"cast", "TypeVar", "NewType"})


def _typed_children(node: ast.AST, kind: type) -> tuple:
    """The children of ``node`` where a string may be read as a type."""
    if kind is ast.arg:
        return (node.annotation,)
    if kind in (ast.FunctionDef, ast.AsyncFunctionDef):
        return (node.returns,)
    if kind is ast.AnnAssign:
        return (node.annotation,)
    if kind is ast.Subscript:
        return (node.slice,)
    if kind is ast.Call:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in _TYPE_CALLS:
            return (*node.args, *node.keywords)
    return ()


@dataclass(frozen=True)
class PlainNames:
    names: frozenset[str]  # bound once, by a module-level import
    counts: Counter  # every name -> how many places bind it, in any scope

    @classmethod
    def of(cls, source: bytes) -> PlainNames | None:
        """None when ``source`` does not parse, or binds names in ways not counted."""
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return None
        counts: Counter = Counter()
        module_imports: set[str] = set()
        blocked: set[str] = set()
        strings: list[str] = []
        stack: list[tuple[ast.AST, bool, bool]] = [(tree, True, False)]
        while stack:
            node, at_module, typed = stack.pop()
            kind = type(node)
            if kind is ast.Name:
                if not isinstance(node.ctx, ast.Load):
                    counts[node.id] += 1
                    if isinstance(node.ctx, ast.Del):
                        blocked.add(node.id)
                continue
            if kind is ast.Constant:
                if typed and isinstance(node.value, str):
                    strings.append(node.value)
                continue
            if kind in (ast.Import, ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*":
                        return None
                    bound = alias.asname or alias.name.split(".")[0]
                    counts[bound] += 1
                    if at_module:
                        module_imports.add(bound)
                continue
            if kind is ast.arg:
                counts[node.arg] += 1
            elif kind in (ast.Global, ast.Nonlocal):
                blocked.update(node.names)
            elif kind is ast.ExceptHandler and node.name:
                counts[node.name] += 1
            elif kind is ast.Match or kind.__name__ in ("TypeVar", "ParamSpec", "TypeVarTuple"):
                return None
            if kind in _SCOPES:
                if kind is not ast.Lambda:
                    counts[node.name] += 1
                at_module = False
            typed_children = _typed_children(node, kind)
            stack.extend((child, at_module, typed or child in typed_children)
                         for child in ast.iter_child_nodes(node))
        names = frozenset(
            name for name in module_imports
            if counts[name] == 1 and name not in blocked and not any(name in s for s in strings)
        )
        return cls(names, counts)
