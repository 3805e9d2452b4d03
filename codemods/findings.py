"""What the codemod reports: one record per edit or per thing it would not edit.

Rule codes are stable (scripts and CI filters key on them); never renumber a code,
only add new ones.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# code -> (short name, what it means). Printed by ``--json`` summaries and docs.
RULES: dict[str, tuple[str, str]] = {
    "MMS001": ("moved-name", "name moved to the new module; reference rewritten"),
    "MMS002": ("moved-private", "private name moved to the new module; rewritten, but it is "
               "private there and its signature may change between releases"),
    "MMS003": ("import-origin", "the old module only imported this name and no longer binds it; "
               "rewritten to its origin module"),
    "MMS004": ("stale-global", "from-import of a module global that is rebound at run time; "
               "the imported value goes stale"),
    "MMS005": ("old-site-patch", "patch or assignment at the name's old look-up site; code that "
               "now lives in the new module does not see it"),
    "MMS006": ("star-import", "star import of the old module relies on names that moved"),
    "MMS007": ("dynamic-access", "dynamic access (getattr, importlib, string) to a moved name; "
               "not rewritten"),
    "MMS008": ("path-loader", "the old module is loaded from a file path; not rewritten"),
    "MMS009": ("removed-name", "name was removed from the old module and has no new home"),
    "MMS010": ("unmapped-import", "the old module bound this name by an import a plain "
               "from-import cannot reproduce; bind it yourself"),
    "MMS011": ("optional-import", "the old module is bound by an import that may fail (a fallback "
               "binds the name otherwise); uses of moved names through it are not rewritten"),
    "MMS012": ("computed-target", "a patch target or module path built at run time (f-string, +, "
               ".format, a constant) names the old module; not rewritten"),
    "MMS013": ("module-stub", "a sys.modules entry for the old module; a stub there no longer "
               "provides the names that moved"),
    "MMS014": ("doc-reference", "a doctest or string annotation names a moved name through the "
               "old module; not rewritten"),
    "MMS015": ("fork", "the tree contains the old module's own file; imports of it inside the tree "
               "resolve to that copy, which may still define the moved names"),
}

# ``# mm-schedule-codemod: ignore`` or ``...: ignore[MMS005, MMS007]`` at the end of the
# line a finding points at silences it, the way noqa comments work for linters.
SUPPRESSION = re.compile(r"#\s*mm-schedule-codemod:\s*ignore(?:\[(?P<codes>[A-Z0-9,\s]+)\])?")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int  # 1-based
    column: int  # 1-based
    code: str
    symbol: str
    message: str
    fixed: bool  # the engine rewrote (or, without writing, would rewrite) this use

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self, mode: str = "write") -> str:
        return render(self, mode)


def status(finding: Finding, mode: str = "write") -> str:
    """What happened to the use: ``fixed`` once written, ``fixable`` when the run only
    checked or showed a diff, ``manual`` when a person has to act."""
    if not finding.fixed:
        return "manual"
    return "fixed" if mode == "write" else "fixable"


def render(finding: Finding, mode: str = "write", *, with_path: bool = True) -> str:
    """One finding as one line of text: ``path:line:col: CODE [status] message``."""
    where = f"{finding.line}:{finding.column}"
    if with_path:
        where = f"{finding.path}:{where}"
    return f"{where}: {finding.code} [{status(finding, mode)}] {finding.message}"


def render_json(finding: Finding, mode: str = "write") -> dict:
    """One finding as a JSON object: every field, plus its ``status`` in this mode."""
    return {**finding.to_dict(), "status": status(finding, mode)}


def suppressed_codes(line: str) -> frozenset[str] | None:
    """The codes a suppression comment on ``line`` silences; an empty set means all of
    them, None that the line has no such comment."""
    match = SUPPRESSION.search(line)
    if match is None:
        return None
    codes = match.group("codes")
    return frozenset(c.strip() for c in codes.split(",") if c.strip()) if codes else frozenset()


def is_suppressed(finding: Finding, line: str) -> bool:
    codes = suppressed_codes(line)
    return codes is not None and (not codes or finding.code in codes)
