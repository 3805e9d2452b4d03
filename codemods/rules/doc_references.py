"""Rule: doctests and string annotations that name a moved name through the old module.

Neither is code the pass can rewrite safely (a doctest's expected output, a forward
reference resolved by a type checker), and both break when the name leaves: a doctest
fails, ``typing.get_type_hints`` raises. They are reported with the line they are on.
"""

from __future__ import annotations

import re

import libcst as cst

from ..engine.collect import literal
from ..engine.imports import alias_binding
from ..engine.migration import Migration
from ..engine.resolve import dotted_name, parent_and_base
from ..fastpath.scan import Scan
from .rule import Rule

_DOCTEST_LINE = re.compile(r"^\s*(?:>>>|\.\.\.)\s?(.*)$")


def plan_doc_references(m: Migration) -> None:
    facts = m.facts
    gone_from_old = facts.map.interesting - facts.map.reexported
    if not gone_from_old:
        return
    prefixes = _old_module_names(m)
    dotted = re.compile(r"(?<![\w.])(" + "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
                        + r")\.(\w+)")
    from_import = re.compile(r"from\s+" + re.escape(facts.old) + r"\s+import\s+\(?([\w\s,]+)")
    for string in facts.found.annotation_strings:
        text = literal(string)
        if text is None:
            continue
        names = [n for _, n in dotted.findall(text) if n in gone_from_old]
        if names:
            m.edits.handled_strings.add(string)
            m.report(string, "MMS014", names[0],
                     f"string annotation names {names[0]!r} through {facts.old}; it moved to "
                     f"{facts.map.destination(names[0])}; rewrite the annotation", False)
    for string in facts.found.docstrings:
        if not isinstance(string, cst.SimpleString) or ">>>" not in string.value:
            continue
        text = literal(string)
        if text is None:
            continue
        for offset, line in enumerate(text.splitlines()):
            match = _DOCTEST_LINE.match(line)
            if match is None:
                continue
            code = match.group(1)
            names = [n for _, n in dotted.findall(code)]
            for imported in from_import.findall(code):
                names += [w.split(" as ")[0].strip() for w in imported.split(",")]
            names = [n for n in names if n in gone_from_old]
            if names:
                m.edits.handled_strings.add(string)
                m.report(string, "MMS014", names[0],
                         f"doctest uses {names[0]!r} through {facts.old}; it moved to "
                         f"{facts.map.destination(names[0])}; update the example", False, offset)


def _old_module_names(m: Migration) -> set[str]:
    """How this file can spell the old module: its dotted name and every name an import
    binds to it."""
    facts = m.facts
    parent, base = parent_and_base(facts.old)
    out = {facts.old, base}
    for site in facts.sites:
        node = site.node
        if isinstance(node, cst.Import):
            for alias in node.names:
                if dotted_name(alias.name) == facts.old and alias.asname is not None:
                    out.add(alias_binding(alias))
        elif site.module == parent and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                if isinstance(alias.name, cst.Name) and alias.name.value == base:
                    out.add(alias_binding(alias))
    out.discard(None)
    return out


CODES = {
    "MMS014": ('doc-reference', 'a doctest or string annotation names a moved name through the old module; not rewritten'),
}


def trigger(scan: Scan) -> bool:
    facts = scan.facts
    texts = [s for s in scan.strings if facts.old_base in s]  # doctests, string annotations
    return any("from " + facts.old in s for s in texts) or any(
        scan.reads_moved(scan.words_in(s)) for s in texts)


RULE = Rule('doc-references', plan_doc_references, trigger, CODES)
