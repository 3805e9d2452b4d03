"""Calls and strings that reach old-module names dynamically.

``mock.patch("old.name")``, ``patch.object(old, "name")``, ``patch.multiple``,
``monkeypatch.setattr``, ``setattr``/``getattr`` and ``importlib.import_module("old")``
name the old module through arguments that the import and attribute phases never see.
A patch of a name that moved to the new module alone is retargeted (the string
rewritten when it has no escapes, the module expression through ``module_ref``), since
the moved code now looks the name up there; lookups and dynamic imports are only
reported, as is any other string that names the old module.
"""

from __future__ import annotations

import re

import libcst as cst

from .collect import literal
from .plan_attributes import AttributePlanning
from .relevance import Gate
from .resolve import dotted_expr


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


class CallPlanning(AttributePlanning):
    def plan_calls(self) -> None:
        for call in self.calls:
            node = call.node
            if call.kind == "patch":
                self._string_target(_argument(node, 0, "target"))
            elif call.kind == "monkeypatch":
                first = _argument(node, 0, "target")
                if isinstance(first, cst.SimpleString) and "." in (literal(first) or ""):
                    self._string_target(first)
                else:
                    self._object_target(node, first, _argument(node, 1, "name"), "patch")
            elif call.kind == "object":
                self._object_target(node, _argument(node, 0, "target"),
                                    _argument(node, 1, "attribute"), "patch")
            elif call.kind == "setattr":
                self._object_target(node, _argument(node, 0), _argument(node, 1), "setattr")
            elif call.kind == "multiple":
                self._multiple(node)
            elif call.kind == "getattr":
                self._dynamic_lookup(node)
            elif call.kind == "import":
                self._dynamic_import(node)

    def _string_target(self, string) -> None:
        """``patch("old.name...")``: rewritten when the name moved to the new module alone."""
        text = literal(string) if string is not None else None
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
        """``patch.object(old, "name")`` and ``setattr(old, "name", v)``."""
        name = literal(attribute) if attribute is not None else None
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
        """``patch.multiple(old, a=..., b=...)`` patches one module, so it can follow the
        names only when all of them moved to the new module alone."""
        target = _argument(call, 0, "target")
        names = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value != "target"]
        hits = [n for n in names if n in self.interesting]
        if target is None or not hits:
            return
        text = literal(target)
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
        obj, attribute = _argument(call, 0), _argument(call, 1)
        name = literal(attribute) if attribute is not None else None
        if obj is None or name not in self.interesting or not self._binds_old_module():
            return
        module, _ = self.resolve_module(obj)
        if module != self.old:
            return
        self.handled_strings.add(attribute)
        self.report(call, "MMS007", name, f"dynamic lookup of {name!r} on {self.old}; it moved to "
                    f"{self.map.destination(name)}; not rewritten", False)

    def _dynamic_import(self, call: cst.Call) -> None:
        target = _argument(call, 0, "name")
        if literal(target) != self.old:
            return
        self.handled_strings.add(target)
        used = sorted(self.interesting & (self.attr_words | {(literal(s) or "") for s in self.strings}))
        if used:
            self.report(call, "MMS007", ",".join(used),
                        f"{self.old} imported dynamically and {', '.join(used)} used in this file; "
                        f"those moved (to {self.new} or their origin); not rewritten", False)

    def plan_dynamic_strings(self) -> None:
        """Strings no call above accounted for: a dotted name or a file path of the old
        module is reported (it may be a lookup this pass cannot follow), never rewritten.
        Docstrings are prose and skipped."""
        gate = Gate.for_map(self.map)
        pattern = re.compile(re.escape(self.old) + r"\.(\w+)")
        for string in self.strings:
            if string in self.handled_strings or string in self.docstrings:
                continue
            text = literal(string)
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
