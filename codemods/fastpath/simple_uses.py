"""Top-level statements whose uses of the map's names are simple shapes.

A large module where nearly every function uses the old module would make libcst parse
and analyse all of it. But a use such as ``mm_utils.get_embedding_chunk``, a moved name
imported at module level, a patch target string or a ``mock.patch("...")`` call, in a
statement where the map's words occur nowhere else (so none of them is bound there),
means the same thing wherever it appears: it resolves to the module-level bindings and
nothing around it changes what the engine does with it. Inside a function or class
body that holds for the whole file (scope analysis does not order such accesses against
module-level assignments); in the module's own scope it holds between two statements
that libcst sees, since only those can bind the names involved. ``statement_uses``
finds such uses with CPython's ``ast`` (no libcst) and says where they are; ``segments``
then hands libcst one copy of each distinct use and copies the outcome (rewrite and
findings) to every place it occurs.

A top-level function, or a method of a top-level class, may also import the old module
itself (a lazy import): ``from <old> import name, ...`` or ``import <old> as alias``
directly in its body, on a line of its own. The uses in its body then read the function's
own bindings, so the body is planned as a whole pattern: ``segments`` hands libcst one
probe function holding the same imports and uses in the same order and copies the
outcome to every function of that pattern (its decorators, defaults and annotations are
read outside it, and stay simple uses of their own). Only
shapes that make the engine invent no name in the function qualify: no imported name is
a rebound global (that needs a module alias) or one the old module lost, and an alias of
the module is only ever read as ``alias.<moved name>``.

Anything less plain makes the whole statement go through libcst: any other import naming a
watched word, a watched word bound or assigned to, a string annotation, a use in
parentheses of its own (libcst's findings would start at the parenthesis), a walrus in
a use, ``__all__``, an ``if`` on a version, ``sys.modules``, an f-string or bytes naming
the map's words, a doctest, or any watched word left over once the recognised uses are
taken out (a keyword argument's name, say; comments do not count).
"""

from __future__ import annotations

import ast
import bisect
import keyword
import re
from dataclasses import dataclass

from ..engine.call_shapes import call_kind
from ..engine.source_text import LINE_END, without_comments

_REFUSED = (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)
_NEXT_TOKEN = re.compile(rb"[ \t\f\r\n]*(.)", re.S)
_WORD_BEFORE = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*\Z")
_WORDS = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_NO_TEXT = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)


@dataclass(frozen=True)
class Use:
    """One use inside a statement: ``kind`` is "arg" (an expression) or "stmt" (a string
    that is a statement of its own, which the engine treats as a docstring)."""

    kind: str  # or "import": a function-local import of the old module, a line of its own
    text: bytes
    nested: bool  # inside a function or class body (else evaluated in the module's scope)
    start: int  # byte offsets in the statement
    end: int
    line: int  # 1-based, within the statement
    column: int  # 0-based, in characters
    indent: bytes = b""  # an import's indentation (its probe's is the same: a wrapped import's lines follow it)
    pattern: int = -1  # which function with its own imports of the old module it sits in, if any


@dataclass(frozen=True)
class LocalImports:
    """What a function-local import of the old module may hold to be planned as a
    pattern (see the module docstring)."""

    old_module: str
    module_attributes: frozenset[str]  # moved names an alias of the module may be read for
    refused_names: frozenset[str]  # names a from-import of it must not hold

    @classmethod
    def for_map(cls, move_map) -> LocalImports:
        plain = frozenset(move_map.moved) - move_map.rebound_globals
        return cls(move_map.old_module, plain, move_map.rebound_globals | move_map.gone)


class _Refused(Exception):
    pass


def statement_uses(
    chunk: bytes, watched: re.Pattern[bytes], local_imports: LocalImports | None = None
) -> tuple[list[Use], bytes] | None:
    """The simple uses in one top-level statement and the statement's text with them
    blanked out, or None when the statement has to go through libcst. With
    ``local_imports``, a top-level function's own imports of the old module are uses too
    (kind "import"), and the uses in such a function's body are its pattern's."""
    try:
        tree = ast.parse(chunk)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1:
        return None
    if b"sys.modules" in chunk or b"__all__" in chunk or (b"version" in chunk.lower() and b"if" in chunk):
        return None
    finder = _Finder(chunk, watched, local_imports)
    try:
        finder.visit(tree.body[0], False, False, None)
    except _Refused:
        return None
    if finder.patterns and not finder.patterns_ok():
        return None
    # A watched word outside the uses and comments (a binding of one, a keyword
    # argument's name) sends the statement to libcst. Only watched names can reach the map's modules (an
    # import that may bind one is watched), so no other binding in the statement changes
    # what a use means: a probe where such a name is unbound gives the same result.
    finder.uses.sort(key=lambda use: use.start)  # the walk visits some fields out of source order
    masked = bytearray(chunk)
    for use in finder.uses:
        masked[use.start : use.end] = b" " * (use.end - use.start)
    if watched.search(masked) and watched.search(without_comments(bytes(masked))):
        return None  # (a comment is nothing to the engine)
    return finder.uses, bytes(masked)


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attribute reads, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _special_call(name: str) -> bool:
    """A call the rules read the arguments of: it is planned as a whole."""
    return call_kind(name) is not None


class _Finder:
    """Walks only the parts of a statement that name a watched word."""

    def __init__(self, chunk: bytes, watched: re.Pattern[bytes], local_imports: LocalImports | None) -> None:
        self.chunk = chunk
        self.watched = watched
        self.local_imports = local_imports
        # (names its own imports bind, those of them bound to the old module) of each
        # function planned as a pattern, and the one whose body is being walked
        self.patterns: list[tuple[set[str], set[str]]] = []
        self.pattern = -1
        self.top: ast.AST | None = None
        self.chain_starts: set[int] = set()  # where the uses that are names or attribute reads start
        self.line_starts = [0] + [m.end() for m in LINE_END.finditer(chunk)]
        # where the watched words are (whole words never straddle a node's edge)
        self.hit_starts, self.hit_ends = [], []
        for match in watched.finditer(chunk):
            self.hit_starts.append(match.start())
            self.hit_ends.append(match.end())
        self.uses: list[Use] = []

    # positions ------------------------------------------------------------------
    def _offset(self, line: int, column: int) -> int:
        return self.line_starts[line - 1] + column

    def _text(self, node: ast.AST) -> bytes:
        return self.chunk[self._offset(node.lineno, node.col_offset) : self._offset(node.end_lineno, node.end_col_offset)]

    def _mentions(self, node: ast.AST) -> bool:
        k = bisect.bisect_left(self.hit_starts, self._offset(node.lineno, node.col_offset))
        return k < len(self.hit_starts) and self.hit_ends[k] <= self._offset(node.end_lineno, node.end_col_offset)

    def _use(self, node: ast.AST, kind: str, nested: bool, in_annotation: bool) -> None:
        if in_annotation and not isinstance(node, (ast.Name, ast.Attribute)):
            raise _Refused  # a string annotation is reported by the engine as such
        start = self._offset(node.lineno, node.col_offset)
        end = self._offset(node.end_lineno, node.end_col_offset)
        if self._wrapped(start, end):
            raise _Refused
        line_start = self.line_starts[node.lineno - 1]
        column = len(self.chunk[line_start:start].decode("utf-8"))
        indent = self.chunk[line_start:start] if kind == "import" else b""
        self.uses.append(Use(kind, self.chunk[start:end], nested, start, end, node.lineno, column, indent, self.pattern))
        if not isinstance(node, (ast.Name, ast.Attribute)) and any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
            raise _Refused  # it would bind a name in the statement's scope

    def _wrapped(self, start: int, end: int) -> bool:
        """Whether the use at bytes ``start:end`` may sit in parentheses of its own:
        libcst counts those as part of the node, so its findings would start there (a
        comment on the way leaves it undecided, which counts as yes)."""
        chunk = self.chunk
        after = _NEXT_TOKEN.match(chunk, end)
        if after is None or after.group(1) not in (b")", b"#"):
            return False
        i = start - 1
        while i >= 0 and chunk[i] in b" \t\f\r\n":
            if chunk[i] in b"\r\n" and b"#" in chunk[self.line_starts[bisect.bisect_right(self.line_starts, i - 1) - 1] : i]:
                return True
            i -= 1
        if i < 0 or chunk[i] != ord("("):
            return False
        i -= 1
        while i >= 0 and chunk[i] in b" \t\f\r\n":
            i -= 1
        if i < 0:
            return True
        if chunk[i] in b")]":
            return False  # the parenthesis of a call
        word = _WORD_BEFORE.search(chunk, 0, i + 1)
        if word is None:
            return True
        name = word.group().decode()
        return keyword.iskeyword(name) or keyword.issoftkeyword(name)

    # the walk ---------------------------------------------------------------------
    def _arguments(self, args: ast.arguments, nested: bool) -> None:
        for arg in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg):
            if arg is not None and arg.annotation is not None:
                self.visit(arg.annotation, nested, True, None)
        for default in (*args.defaults, *args.kw_defaults):
            if default is not None:
                self.visit(default, nested, False, None)

    def visit(self, node: ast.AST, nested: bool, in_annotation: bool, parent: ast.AST | None) -> None:
        if self.top is None:
            self.top = node
        if hasattr(node, "end_col_offset") and not self._mentions(node):
            return
        if isinstance(node, _REFUSED):
            raise _Refused
        if (isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute))
                and any(isinstance(t, ast.Attribute) for t in node.targets)):
            raise _Refused  # ``self.mm = mm_utils``: the rules follow the module into the attribute
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for decorator in node.decorator_list:
                self.visit(decorator, nested, in_annotation, node)
            if isinstance(node, ast.ClassDef):
                for base in (*node.bases, *node.keywords):
                    self.visit(base, nested, in_annotation, node)
                for statement in node.body:
                    self.visit(statement, True, False, node)
                return
            self._arguments(node.args, nested)
            if node.returns is not None:
                self.visit(node.returns, nested, True, node)
            outer = self.pattern
            if node is self.top or (parent is self.top and isinstance(parent, ast.ClassDef)):
                if any(isinstance(s, (ast.Import, ast.ImportFrom)) and self._mentions(s) for s in node.body):
                    self.pattern = len(self.patterns)
                    self.patterns.append((set(), set()))
            for statement in node.body:
                if self.pattern != outer and isinstance(statement, (ast.Import, ast.ImportFrom)) and self._mentions(statement):
                    self._local_import(statement)
                else:
                    self.visit(statement, True, False, node)
            self.pattern = outer
            return
        if isinstance(node, ast.Lambda):
            self._arguments(node.args, nested)
            self.visit(node.body, True, in_annotation, node)
            return
        if isinstance(node, ast.AnnAssign):
            self.visit(node.target, nested, in_annotation, node)
            self.visit(node.annotation, nested, True, node)
            if node.value is not None:
                self.visit(node.value, nested, in_annotation, node)
            return
        if isinstance(node, (ast.Name, ast.Attribute)):
            self._chain(node, nested, in_annotation)
            return
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name is not None and _special_call(name) and self._mentions(node):
                self._use(node, "arg", nested, in_annotation)
                return
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, (str, bytes)) and self._mentions(node):
                if not isinstance(node.value, str) or (isinstance(parent, ast.Expr) and b">>>" in self._text(node)):
                    raise _Refused
                self._use(node, "stmt" if isinstance(parent, ast.Expr) else "arg", nested, in_annotation)
            return
        elif isinstance(node, ast.JoinedStr):
            raise _Refused  # naming a watched word (else not walked)
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                for child in value:
                    if isinstance(child, ast.AST) and not isinstance(child, _NO_TEXT):
                        self.visit(child, nested, in_annotation, node)
            elif isinstance(value, ast.AST) and not isinstance(value, _NO_TEXT):
                self.visit(value, nested, in_annotation, node)

    def patterns_ok(self) -> bool:
        """Whether the functions with their own imports of the old module can be planned
        as patterns: an alias of the module read only as ``alias.<moved name>`` in the
        body that imports it (anything else makes the engine invent a second alias)."""
        for use in self.uses:
            if use.pattern < 0 or use.kind == "import":
                continue
            local_modules = self.patterns[use.pattern][1]
            words = [w.decode() for w in _WORDS.findall(use.text)]
            if any(w in local_modules for w in words[1:]):
                return False
            if words[0] in local_modules and (
                use.start not in self.chain_starts or len(words) < 2
                or words[1] not in self.local_imports.module_attributes
            ):
                return False
        return True

    def _local_import(self, node: ast.Import | ast.ImportFrom) -> None:
        """A top-level function's own import of the old module, when it is one the
        engine rewrites in place: recorded as a use, else refused."""
        spec = self.local_imports
        if spec is None or node.lineno != node.end_lineno:
            raise _Refused
        if isinstance(node, ast.ImportFrom):
            if node.level or node.module != spec.old_module:
                raise _Refused
            if any(alias.name == "*" or alias.name in spec.refused_names for alias in node.names):
                raise _Refused
        elif len(node.names) != 1 or node.names[0].name != spec.old_module or node.names[0].asname is None:
            raise _Refused
        start = self._offset(node.lineno, node.col_offset)
        end = self._offset(node.end_lineno, node.end_col_offset)
        line_start = self.line_starts[node.lineno - 1]
        line_end = self.line_starts[node.lineno] if node.lineno < len(self.line_starts) else len(self.chunk)
        if self.chunk[line_start:start].strip(b" \t\f") or self.chunk[end:line_end].strip(b" \t\f\r\n"):
            raise _Refused  # not a line of its own (a comment, a semicolon, another statement)
        local_names, local_modules = self.patterns[self.pattern]
        for alias in node.names:
            name = alias.asname or alias.name
            if name in local_names:
                raise _Refused  # bound twice: which binding a use reads depends on more than order
            local_names.add(name)
            if isinstance(node, ast.Import):
                local_modules.add(name)
        self._use(node, "import", True, False)

    def _chain(self, node: ast.Name | ast.Attribute, nested: bool, in_annotation: bool) -> None:
        """A name, or attribute reads on one: a use when it names a watched word."""
        if _dotted(node) is None:
            # attribute of something that is not a plain name: its value is walked, and
            # a watched attribute name here is left for the final check to refuse
            self.visit(node.value, nested, in_annotation, node)
            return
        if not isinstance(node.ctx, ast.Load):
            raise _Refused  # a watched name bound, or an attribute of the old module set
        self._use(node, "arg", nested, in_annotation)
        self.chain_starts.add(self.uses[-1].start)
