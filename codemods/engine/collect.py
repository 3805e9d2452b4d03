"""Step one of a file's migration: one read-only visit that gathers the facts to plan from.

Planning needs to know, for every import statement, *where* it sits (the statement list
that owns it, its position there, any try/except around it) so that edits can merge
into an earlier import of the same block or leave a compatibility shim alone. It also
needs every attribute access whose attribute name left the old module, every call that
may name an attribute dynamically (``mock.patch``, ``setattr``, ``import_module``...),
every string literal, the module-level ``__all__`` entries and every name in use (so
that an added binding never shadows one). Gathering all of it in one pass keeps the
per-file cost to a single tree walk; nothing here decides an edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .call_shapes import call_kind
from .imports import alias_binding
from .resolve import absolute_module, dotted_name

# An ``except`` of one of these can catch a failed import, so its body may hold the
# fallback half of a compatibility shim.
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(eq=False)
class ImportSite:
    """One import statement and where it sits."""

    node: cst.Import | cst.ImportFrom
    line: cst.SimpleStatementLine | cst.SimpleStatementSuite
    block: cst.CSTNode  # owner of the statement list (Module, IndentedBlock or suite)
    index: int  # position of ``line`` in ``block``
    module: str | None  # absolute module of a from-import
    try_ctx: tuple[cst.CSTNode, str] | None  # (Try node, "body" | "handler" | "other")
    protected: bool = False  # in the old-version branch of an ``if`` on the version
    module_scope: bool = True  # not inside a function or class body


@dataclass(eq=False)
class CallSite:
    """A call that may reach an old-module name through its arguments; ``kind`` says
    which argument holds what (see ``Collector.visit_Call``)."""

    kind: str
    node: cst.Call


@dataclass(eq=False)
class Collected:
    """Everything one visit found in a file."""

    sites: list[ImportSite] = field(default_factory=list)
    names_seen: set[str] = field(default_factory=set)
    attr_words: set[str] = field(default_factory=set)  # every attribute name used
    attributes: list[cst.Attribute] = field(default_factory=list)  # ``x.name``, name of interest
    stores: set[cst.CSTNode] = field(default_factory=set)  # attributes assigned or deleted
    all_names: set[str] = field(default_factory=set)  # module-level ``__all__`` entries
    docstrings: set[cst.CSTNode] = field(default_factory=set)
    strings: list[cst.SimpleString] = field(default_factory=list)
    calls: list[CallSite] = field(default_factory=list)
    # NAME = "text" assignments (None when a name gets several values): module paths
    # kept in constants and used to build patch targets
    constants: dict[str, str | None] = field(default_factory=dict)
    module_slots: list[cst.BaseExpression] = field(default_factory=list)  # keys into sys.modules
    annotation_strings: list[cst.SimpleString] = field(default_factory=list)
    # ``self.mm = <name or attribute>``: (the target's dotted text, the value), so that a
    # module kept in an attribute is seen where it is used (``self.mm.name``)
    attribute_holders: list[tuple[str, cst.BaseExpression]] = field(default_factory=list)
    # every name read, by its text (attribute names and keywords left out): the uses of a
    # binding when no scope analysis is needed to tell them apart (``facts.light``)
    loads: dict[str, list[cst.Name]] = field(default_factory=dict)


def collect(module: cst.Module, package: str | None, interesting: frozenset[str],
            new_module: str | None = None) -> Collected:
    """Walk ``module`` once; relative imports resolve against ``package``, and only
    attributes named in ``interesting`` are kept. With ``new_module``, the branches of an
    ``if`` on a version that do not use it, while another branch does, are left out (the
    code there is for releases before the split)."""
    collector = Collector(package, interesting, new_module)
    module.visit(collector)
    return collector.found


class Collector(cst.CSTVisitor):
    """Fills ``found``; the stacks below track which statement list, position and
    try/except the import being visited sits in."""

    def __init__(self, package: str | None, interesting: frozenset[str], new_module: str | None = None) -> None:
        super().__init__()
        self.package = package
        self.interesting = interesting
        self._new_word = new_module.rsplit(".", 1)[-1] if new_module else None
        self._old_branches: set[cst.CSTNode] = set()  # blocks kept for older releases
        self._protected = 0
        self.found = Collected()
        self._blocks: list[list] = []  # [owner, next index]
        self._line: cst.CSTNode | None = None
        self._line_index = 0
        self._tries: list[tuple[cst.CSTNode, str]] = []
        self._try_tails: dict[cst.CSTNode, cst.CSTNode] = {}
        self._depth = 0  # function/class nesting; __all__ counts only at module level
        self._seen_elifs: set[cst.CSTNode] = set()
        self._in_annotation = 0
        # attribute names and keywords: Names that are no reads, until they are visited
        self._not_loads: set[cst.CSTNode] = set()

    # statement containers -------------------------------------------------------
    def _enter_block(self, node: cst.CSTNode) -> None:
        self._blocks.append([node, 0])

    def visit_Module(self, node: cst.Module) -> None:
        self._enter_block(node)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._enter_block(node)
        self._protected += node in self._old_branches

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.pop()
        self._protected -= node in self._old_branches

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._line, self._line_index = node, 0
        self._protected += node in self._old_branches

    def leave_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._line = None
        self._protected -= node in self._old_branches

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
        if self._new_word and node not in self._seen_elifs:
            self._version_branches(node)

    def _version_branches(self, node: cst.If) -> None:
        """In ``if <version test>: ... elif ...: ... else: ...``, a branch that does not
        mention the new module while another one does is code for older releases."""
        branches, tests, current = [], [], node
        while isinstance(current, cst.If):
            tests.append(current.test)
            branches.append(current.body)
            self._seen_elifs.add(current)
            current = current.orelse
        if isinstance(current, cst.Else):
            branches.append(current.body)
        code = cst.Module(body=[]).code_for_node
        if len(branches) < 2 or not any("version" in code(t).lower() for t in tests):
            return
        uses_new = [self._new_word in code(b) for b in branches]
        if any(uses_new):
            self._old_branches.update(b for b, new in zip(branches, uses_new) if not new)

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
        site = ImportSite(
            node=node,
            line=self._line,
            block=block,
            index=self._line_index,
            module=module,
            try_ctx=self._tries[-1] if self._tries else None,
            protected=self._protected > 0,
            module_scope=self._depth == 0,
        )
        self.found.sites.append(site)
        for alias in node.names if not isinstance(node.names, cst.ImportStar) else ():
            bound = alias_binding(alias)
            if bound:
                self.found.names_seen.add(bound)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        module = absolute_module(
            self.package, len(node.relative), dotted_name(node.module) if node.module else None
        )
        self._site(node, module)
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        self._site(node, None)
        for alias in node.names:
            name = dotted_name(alias.name)
            if name:
                self.found.names_seen.add(name.split(".")[0])
        return False

    # uses -----------------------------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        self.found.names_seen.add(node.value)
        if node in self._not_loads:
            self._not_loads.discard(node)
        else:
            self.found.loads.setdefault(node.value, []).append(node)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_loads.add(node.keyword)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._not_loads.add(node.attr)
        self.found.attr_words.add(node.attr.value)
        if node.attr.value in self.interesting and not self._protected:
            self.found.attributes.append(node)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if dotted_name(node.value) == "sys.modules" and len(node.slice) == 1 and not self._protected:
            index = node.slice[0].slice
            if isinstance(index, cst.Index):
                self.found.module_slots.append(index.value)

    def visit_Annotation(self, node: cst.Annotation) -> None:
        self._in_annotation += 1

    def leave_Annotation(self, node: cst.Annotation) -> None:
        self._in_annotation -= 1

    def _stores(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Attribute):
            self.found.stores.add(target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._stores(element.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            text = literal(node.value)
            if text is not None:
                name = node.targets[0].target.value
                known = self.found.constants
                known[name] = text if known.get(name, text) == text else None
        if isinstance(node.value, (cst.Name, cst.Attribute)):
            for target in node.targets:
                if isinstance(target.target, cst.Attribute):
                    held = dotted_name(target.target)
                    if held is not None:
                        self.found.attribute_holders.append((held, node.value))
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
                text = literal(element.value)
                if text is not None:
                    self.found.all_names.add(text)

    def visit_Expr(self, node: cst.Expr) -> None:
        if isinstance(node.value, (cst.SimpleString, cst.ConcatenatedString)):
            self.found.docstrings.add(node.value)
            if isinstance(node.value, cst.ConcatenatedString):
                self.found.docstrings.update(_parts(node.value))

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if not self._protected:
            self.found.strings.append(node)
            if self._in_annotation:
                self.found.annotation_strings.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted_name(node.func) or ""
        kind = call_kind(name)
        if kind == "dict":
            kind = None
            if node.args and dotted_name(node.args[0].value) == "sys.modules" and len(node.args) > 1 \
                    and isinstance(node.args[1].value, cst.Dict):
                self.found.module_slots.extend(
                    e.key for e in node.args[1].value.elements if isinstance(e, cst.DictElement)
                )
        elif kind == "module-slot":
            kind = None
            if node.args:
                self.found.module_slots.append(node.args[0].value)
        elif self._depth == 0 and name in ("__all__.extend", "__all__.append") and node.args:
            value = node.args[0].value
            text = literal(value)
            if text is not None:
                self.found.all_names.add(text)
            else:
                self._all_entries(value)
        if kind and not self._protected:
            self.found.calls.append(CallSite(kind, node))


def literal(node: cst.CSTNode) -> str | None:
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
