"""What the codemod reports: one record per edit or per thing it would not edit.

Finding codes are stable (scripts and CI filters key on them); never renumber a code,
only add new ones. Each code is owned by the rule that raises it (``rules/``); the table of
all of them is ``rules.CODES``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
