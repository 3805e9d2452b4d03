"""Rule: calls that reach old-module names through their arguments.

``mock.patch("old.name")``, ``patch.object(old, "name")``, ``patch.multiple``,
``monkeypatch.setattr``, ``setattr``/``getattr`` and ``importlib.import_module("old")``
name the old module through arguments that the import and attribute rules never see.
A patch of a name that moved to the new module alone is retargeted (the string
rewritten when it has no escapes, the module expression through ``module_ref``), since
the moved code now looks the name up there; lookups and dynamic imports are only
reported.
"""

from __future__ import annotations

import re

import libcst as cst

from ..engine.collect import literal
from ..engine.migration import Migration
from ..engine.module_bindings import module_ref, resolve_module
from ..engine.resolve import dotted_expr, dotted_name
from ..fastpath.scan import Scan
from .from_imports import move_code, report_gone, report_move
from .module_attributes import old_site_write
from .rule import Rule


def plan_calls(m: Migration) -> None:
    for call in m.facts.found.calls:
        node = call.node
        if call.kind == "patch":
            _string_target(m, _argument(node, 0, "target"))
        elif call.kind == "monkeypatch":
            first = _argument(node, 0, "target")
            if isinstance(first, cst.SimpleString) and "." in (literal(first) or ""):
                _string_target(m, first)
            elif isinstance(first, (cst.FormattedString, cst.BinaryOperation, cst.Call)):
                _computed_target(m, first, "patch")
            else:
                _object_target(m, node, first, _argument(node, 1, "name"), "patch")
        elif call.kind == "object":
            _object_target(m, node, _argument(node, 0, "target"), _argument(node, 1, "attribute"), "patch")
        elif call.kind == "setattr":
            _object_target(m, node, _argument(node, 0), _argument(node, 1), "setattr")
        elif call.kind == "multiple":
            _multiple(m, node)
        elif call.kind == "getattr":
            _dynamic_lookup(m, node)
        elif call.kind == "import":
            _dynamic_import(m, node)


def _argument(call: cst.Call, position: int, keyword: str | None = None):
    """The argument passed as ``keyword`` if any, else the one at ``position``."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if keyword:
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == keyword:
                return arg.value
    if position < len(positional):
        return positional[position].value
    return None


def _with_literal(node: cst.SimpleString, text: str) -> cst.SimpleString | None:
    """``node`` holding ``text``, same prefix and quotes; None if it has escapes."""
    body = node.value[len(node.prefix) + len(node.quote) : -len(node.quote)]
    if body != node.evaluated_value or "\\" in text or node.quote in text:
        return None
    return node.with_changes(value=f"{node.prefix}{node.quote}{text}{node.quote}")


def approximate(expr, constants: dict[str, str | None]) -> str | None:
    """The text a string expression builds, with ``\0`` for what cannot be known here:
    literals, f-strings, ``+``, ``"...".format(...)`` and names bound once to a literal."""
    if isinstance(expr, cst.SimpleString):
        return literal(expr)
    if isinstance(expr, cst.Name):
        return constants.get(expr.value) or "\0"
    if isinstance(expr, cst.ConcatenatedString):
        left, right = approximate(expr.left, constants), approximate(expr.right, constants)
        return None if left is None or right is None else left + right
    if isinstance(expr, cst.FormattedString):
        out = []
        for part in expr.parts:
            if isinstance(part, cst.FormattedStringText):
                out.append(part.value)
            else:
                out.append(approximate(part.expression, constants) or "\0")
        return "".join(out)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        left, right = approximate(expr.left, constants), approximate(expr.right, constants)
        return None if left is None and right is None else (left or "\0") + (right or "\0")
    if (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value == "format"):
        template = approximate(expr.func.value, constants)
        if template is None:
            return None
        values = [approximate(a.value, constants) or "\0" for a in expr.args if a.keyword is None]
        named = {a.keyword.value: approximate(a.value, constants) or "\0" for a in expr.args if a.keyword}
        position = iter(values)

        def field(match: re.Match) -> str:
            key = match.group(1)
            if not key:
                return next(position, "\0")
            if key.isdigit():
                return values[int(key)] if int(key) < len(values) else "\0"
            return named.get(key, "\0")

        return re.sub(r"\{([^{}!:]*)[^{}]*\}", field, template)
    return None


def _computed_target(m: Migration, expr, how: str) -> None:
    """A patch target built at run time that names a name which left the old module."""
    facts = m.facts
    text = approximate(expr, facts.found.constants)
    if text is None:
        return
    names = [n for n in re.findall(re.escape(facts.old) + r"\.(\w+)", text) if n in facts.map.interesting]
    if names:
        m.report(expr, "MMS012", names[0],
                 f"{how} target built at run time names {facts.old}.{names[0]}, which moved to "
                 f"{facts.map.destination(names[0])}; not rewritten", False)


def _string_target(m: Migration, string) -> None:
    """``patch("old.name...")``: rewritten when the name moved to the new module alone."""
    facts = m.facts
    old, new, move_map = facts.old, facts.new, facts.map
    if string is not None and not isinstance(string, cst.SimpleString):
        _computed_target(m, string, "patch")
        return
    text = literal(string) if string is not None else None
    if text is None or not text.startswith(old + "."):
        return
    m.edits.handled_strings.add(string)
    name = text[len(old) + 1 :].split(".")[0]
    if name not in move_map.interesting:
        return
    if name in move_map.moved and name not in move_map.reexported:
        replacement = _with_literal(string, new + text[len(old) :])
        if replacement is None:
            m.report(string, "MMS007", name, f"patch target {text!r}: {name!r} moved to "
                     f"{new}; string has escapes, not rewritten", False)
            return
        if m.held(string, move_code(m.facts.map, name)):
            return
        m.edits.expressions[string] = replacement
        report_move(m, string, name, new, "patch target")
        return
    old_site_write(m, string, name, None, (), "patch")


def _object_target(m: Migration, call: cst.Call, obj, attribute, how: str) -> None:
    """``patch.object(old, "name")`` and ``setattr(old, "name", v)``."""
    name = literal(attribute) if attribute is not None else None
    if obj is None or name is None or name not in m.facts.map.interesting:
        return
    if not m.facts.binds_old_module:
        return
    module, refs = resolve_module(m, obj)
    if module != m.facts.old:
        return
    m.edits.handled_strings.add(attribute)
    old_site_write(m, call, name, obj, refs, how)


def _multiple(m: Migration, call: cst.Call) -> None:
    """``patch.multiple(old, a=..., b=...)`` patches one module, so it can follow the
    names only when all of them moved to the new module alone."""
    facts, edits = m.facts, m.edits
    old, new, move_map = facts.old, facts.new, facts.map
    target = _argument(call, 0, "target")
    names = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value != "target"]
    hits = [n for n in names if n in move_map.interesting]
    if target is None or not hits:
        return
    text = literal(target)
    if text is not None:
        if text != old:
            return
        edits.handled_strings.add(target)
        refs = ()
    else:
        if not facts.binds_old_module:
            return
        module, refs = resolve_module(m, target)
        if module != old:
            return
    if all(n in move_map.moved and n not in move_map.reexported for n in names):
        if any(m.held(call, move_code(m.facts.map, n)) for n in hits):
            return
        if text is not None:
            replacement = _with_literal(target, new)
            if replacement is not None:
                edits.expressions[target] = replacement
                for n in hits:
                    report_move(m, call, n, new, "patch.multiple")
                return
        elif len(refs) == 1 and facts.site_of(refs[0].node) is not None:
            site = facts.site_of(refs[0].node)
            edits.expressions[target] = dotted_expr(module_ref(m, site, new))
            edits.rewritten_uses.add(id(target))
            edits.touched_bindings[id(refs[0])] = (refs[0], site)
            for n in hits:
                report_move(m, call, n, new, "patch.multiple")
            return
    m.report(call, "MMS005", ",".join(hits),
             f"patch.multiple on {old} names {', '.join(hits)}: they do not all live in "
             f"{new} only; split the patch by module", False)


def _dynamic_lookup(m: Migration, call: cst.Call) -> None:
    """``getattr(old, "name")`` / ``hasattr``: treated like ``setattr``. A name that moved
    to the new module alone is looked up there (the old module no longer has it); a
    re-exported one still resolves on the old module and needs nothing; an import-only
    name is reported."""
    facts = m.facts
    obj, attribute = _argument(call, 0), _argument(call, 1)
    name = literal(attribute) if attribute is not None else None
    if obj is None or name not in facts.map.interesting or not facts.binds_old_module:
        return
    module, refs = resolve_module(m, obj)
    if module != facts.old:
        return
    m.edits.handled_strings.add(attribute)
    move_map = facts.map
    if name in move_map.reexported:
        return
    how = dotted_name(call.func) or "getattr"
    site = facts.site_of(refs[0].node) if len(refs) == 1 else None
    if name in move_map.moved and site is not None:
        if m.held(call, move_code(m.facts.map, name)):
            return
        m.edits.expressions[obj] = dotted_expr(module_ref(m, site, facts.new))
        m.edits.rewritten_uses.add(id(obj))
        m.edits.touched_bindings[id(refs[0])] = (refs[0], site)
        report_move(m, call, name, facts.new, how)
        return
    if name in move_map.gone:
        report_gone(m, call, name)
        return
    m.report(call, "MMS007", name, f"{how} of {name!r} on {facts.old}; it moved to "
             f"{move_map.destination(name)}; not rewritten", False)


def _dynamic_import(m: Migration, call: cst.Call) -> None:
    facts = m.facts
    target = _argument(call, 0, "name")
    if literal(target) != facts.old:
        return
    m.edits.handled_strings.add(target)
    words = facts.found.attr_words | {(literal(s) or "") for s in facts.found.strings}
    used = sorted(facts.map.interesting & words)
    if used:
        m.report(call, "MMS007", ",".join(used),
                 f"{facts.old} imported dynamically and {', '.join(used)} used in this file; "
                 f"those moved (to {facts.new} or their origin); not rewritten", False)


CODES = {
    "MMS007": ('dynamic-access', 'dynamic access (getattr, importlib, string) to a moved name; not rewritten'),
    "MMS012": ('computed-target', 'a patch target or module path built at run time (f-string, +, .format, a constant) names the old module; not rewritten'),
}


def trigger(scan: Scan) -> bool:
    # a patch target string, or a moved name passed as a string or keyword next to the module
    return any(scan.names_old_module(s) for s in scan.strings) or scan.reads_moved(
        scan.keywords.union(scan.strings))


RULE = Rule('calls', plan_calls, trigger, CODES)
