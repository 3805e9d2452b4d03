"""Tree check: the tree holds the old module's own file (a fork of the upstream package).

Not a per-file rule: it looks at the list of files a run found, before anything is
rewritten.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..movemap.schema import MoveMap
from ..report.findings import Finding

CODES = {
    "MMS015": ('fork', "the tree contains the old module's own file; imports of it inside the tree resolve to that copy, which may still define the moved names"),
}


def fork_warnings(paths: Iterable[str | os.PathLike], move_map: MoveMap) -> list[Finding]:
    """One MMS015 finding per file among ``paths`` that is the old module itself (a fork
    of the upstream package keeps ``.../managers/mm_utils.py``). Imports of the old module
    inside such a tree resolve to that copy; call this before retargeting them."""
    parts = move_map.old_module.split(".")
    suffixes = ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py")
    out = []
    for path in paths:
        posix = Path(path).as_posix()
        if any(posix == s or posix.endswith("/" + s) for s in suffixes):
            out.append(Finding(
                os.fspath(path), 1, 1, "MMS015", move_map.old_module,
                f"this tree has its own {move_map.old_module} ({'/'.join(parts)}.py): imports of it "
                f"inside the tree load this copy, not upstream's; check which names this copy still "
                f"defines before accepting the rewrites to {move_map.new_module}", False,
            ))
    return out
