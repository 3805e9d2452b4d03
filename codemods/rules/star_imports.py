"""Rule: star imports of the old module.

Which names a star import provided is not visible in the file, so it is never rewritten;
it is reported when the file relies on a name that left: one listed in ``__all__`` or
used without any binding the scope analysis can see.
"""

from __future__ import annotations

import libcst as cst

from ..engine.migration import Migration
from ..fastpath.scan import Scan
from .rule import Rule


def plan_star_imports(m: Migration) -> None:
    facts = m.facts
    stars = [
        s for s in facts.sites
        if isinstance(s.node, cst.ImportFrom) and isinstance(s.node.names, cst.ImportStar)
        and s.module == facts.old
    ]
    if not stars:
        return
    interesting = facts.map.interesting
    relied = set(facts.found.all_names & interesting)
    if interesting & m.edits.taken_names:
        for node, refs in facts.referents.items():
            if isinstance(node, cst.Name) and node.value in interesting and not refs:
                relied.add(node.value)
    if not relied:
        return
    names = sorted(relied)
    for site in stars:
        m.report(site.node, "MMS006", ",".join(names),
                 f"'from {facts.old} import *' no longer provides {', '.join(names)}; "
                 "import them explicitly from their new home", False)


CODES = {
    "MMS006": ('star-import', 'star import of the old module relies on names that moved'),
}


def trigger(scan: Scan) -> bool:
    return any(module == scan.facts.old and "*" in names for module, names in scan.from_imports)


RULE = Rule('star-imports', plan_star_imports, trigger, CODES)
