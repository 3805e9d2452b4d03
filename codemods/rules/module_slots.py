"""Rule: ``sys.modules`` entries for the old module (a stub there no longer stands in for
the names that moved)."""

from __future__ import annotations

import libcst as cst

from ..engine.migration import Migration
from ..fastpath.scan import Scan
from .calls import approximate
from .rule import Rule


def plan_module_slots(m: Migration) -> None:
    """``sys.modules["old"] = stub`` (or ``patch.dict(sys.modules, {...})``): code that
    imports a moved name now imports the new module, which the stub does not replace."""
    facts = m.facts
    for key in facts.found.module_slots:
        text = approximate(key, facts.found.constants)
        if text != facts.old:
            continue
        if isinstance(key, cst.SimpleString):
            m.edits.handled_strings.add(key)
        m.report(key, "MMS013", facts.old,
                 f"sys.modules entry for {facts.old}: a stub there no longer stands in for the "
                 f"names that moved to {facts.new}; stub {facts.new} as well", False)


CODES = {
    "MMS013": ('module-stub', 'a sys.modules entry for the old module; a stub there no longer provides the names that moved'),
}


def trigger(scan: Scan) -> bool:
    return any(scan.names_old_module(s) for s in scan.strings)


RULE = Rule('module-slots', plan_module_slots, trigger, CODES)
