"""Rule: strings no call accounted for that name the old module.

A dotted name or a file path of the old module in a string may be a lookup this pass
cannot follow, so it is reported, never rewritten. Docstrings are prose and skipped.
"""

from __future__ import annotations

import re

from ..engine.collect import literal
from ..engine.migration import Migration
from ..engine.resolve import path_forms
from ..fastpath.scan import Scan
from .rule import Rule


def plan_strings(m: Migration) -> None:
    facts = m.facts
    old, move_map = facts.old, facts.map
    forms = path_forms(old)
    pattern = re.compile(re.escape(old) + r"\.(\w+)")
    for string in facts.found.strings:
        if string in m.edits.handled_strings or string in facts.found.docstrings:
            continue
        text = literal(string)
        if text is None:
            continue
        names = [n for n in pattern.findall(text) if n in move_map.interesting]
        if names:
            m.report(string, "MMS007", names[0],
                     f"string names {old}.{names[0]}, which moved to "
                     f"{move_map.destination(names[0])}; not rewritten", False)
        elif any(form in text for form in forms):
            m.report(string, "MMS008", old,
                     f"file path of {old}; moved names now live in {facts.new}; "
                     "not rewritten", False)


CODES = {
    "MMS008": ('path-loader', 'the old module is loaded from a file path; not rewritten'),
}


def trigger(scan: Scan) -> bool:
    forms = scan.facts.path_forms
    return any(scan.names_old_module(s) or any(f in s for f in forms) for s in scan.strings)


RULE = Rule('strings', plan_strings, trigger, CODES)
