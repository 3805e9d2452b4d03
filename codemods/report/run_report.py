"""What a run tells its user: finding lines, failures, the summary and the JSON report.

Only what happened is reported: a fix is ``[fixed]`` and a file is in
``changed_files`` only once its new content is on disk; a check or a diff says
``[fixable]``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from ..rules import CODES, OPTIONAL
from .failures import FAILURES, Failure
from .findings import Finding, render, render_json

SCHEMA_VERSION = 2


def printable(text: str) -> str:
    """``text`` with bytes that are not UTF-8 (undecodable file names) as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class FileResult:
    shown: str
    findings: list[Finding] = field(default_factory=list)
    cells: list[int | None] = field(default_factory=list)  # per finding, notebooks only
    old: bytes | None = None  # both set when the file has changes
    new: bytes | None = None
    written: bool = False
    error: Failure | None = None

    @property
    def changes(self) -> bool:
        return self.new is not None

    def finding_lines(self) -> list[str]:
        mode = "write" if self.written else "check"
        lines = []
        for finding, cell in zip(self.findings, self.cells or [None] * len(self.findings)):
            where = self.shown if cell is None else f"{self.shown}:cell {cell}"
            lines.append(printable(f"{where}:{render(finding, mode, with_path=False)}"))
        return lines

    def finding_dicts(self) -> list[dict]:
        mode = "write" if self.written else "check"
        out = []
        for finding, cell in zip(self.findings, self.cells or [None] * len(self.findings)):
            entry = render_json(finding, mode)
            entry["path"] = self.shown
            if cell is not None:
                entry["cell"] = cell
            out.append(entry)
        return out


@dataclass
class RunReport:
    mode: str
    map_info: dict
    results: list[FileResult]
    scanned: int
    matched: int
    problems: list[tuple[str, Failure]]  # paths that could not even be looked at
    skipped: list[tuple[str, str]]  # paths left out on purpose, with the reason
    # codes that do not fail --check: optional codes no selector named (``report.selection``)
    optional: frozenset[str] = OPTIONAL

    @property
    def failed(self) -> list[FileResult]:
        return [r for r in self.results if r.error]

    def summary(self) -> dict:
        findings = [(r, f) for r in self.results for f in r.findings]
        manual = sum(1 for _, f in findings if not f.fixed)
        fixed = sum(1 for r, f in findings if f.fixed and r.written)
        return {
            "files_scanned": self.scanned,
            "files_matched": self.matched,
            "prefiltered": self.scanned - self.matched,
            "files_skipped": len(self.skipped),
            "files_changed": sum(1 for r in self.results if r.written),
            "files_would_change": sum(1 for r in self.results if r.changes and not r.written
                                      and not r.error),
            "files_failed": len(self.failed) + len(self.problems),
            "findings": len(findings),
            "fixed": fixed,
            "fixable": len(findings) - manual - fixed,
            "manual": manual,
            "by_code": dict(sorted(Counter(f.code for _, f in findings).items())),
        }

    def fails_check(self) -> bool:
        """Whether a check or a diff leaves work to do: a finding whose code is not
        optional, or a change that no finding accounts for. A file whose only changes
        are optional rewrites passes (``--write`` still applies them)."""
        return any(any(f.code not in self.optional for f in r.findings)
                   or (r.changes and not r.written and not r.error and not r.findings)
                   for r in self.results)

    def summary_line(self) -> str:
        s = self.summary()
        if self.mode == "write":
            files = f"{s['files_changed']} changed"
            fixes = f"{s['fixed']} fixed"
        else:
            files = f"{s['files_would_change']} would change"
            fixes = f"{s['fixable']} fixable"
        text = (f"{s['files_scanned']} files scanned, {files}, {s['findings']} findings "
                f"({fixes}, {s['manual']} need a person)")
        if s["fixable"] and self.mode == "write":
            text += f", {s['fixable']} fixable but not written"
        if s["files_failed"]:
            text += f", {s['files_failed']} failed"
        return text

    def failures(self) -> list[tuple[str, Failure]]:
        """Every path that was not processed, with why: discovery's first."""
        return self.problems + [(r.shown, r.error) for r in self.failed]

    def failure_lines(self) -> list[str]:
        return [printable(failure.render(path)) for path, failure in self.failures()]

    def to_json(self) -> str:
        document = {
            "tool": "mm-schedule-codemod",
            "schema_version": SCHEMA_VERSION,
            "mode": self.mode,
            "map": self.map_info,
            "rules": {code: {"name": name, "summary": text} for code, (name, text) in CODES.items()},
            "failure_codes": {code: {"name": name, "summary": text}
                              for code, (name, text) in FAILURES.items()},
            "summary": self.summary(),
            "changed_files": [r.shown for r in self.results if r.written],
            "would_change_files": [r.shown for r in self.results
                                   if r.changes and not r.written and not r.error],
            "failed_files": [failure.to_dict(printable(path)) for path, failure in self.failures()],
            "skipped": [{"path": printable(p), "reason": why} for p, why in self.skipped],
            "findings": [d for r in self.results for d in r.finding_dicts()],
        }
        # ensure_ascii keeps undecodable file names (surrogate escapes) representable.
        return json.dumps(document, indent=2, ensure_ascii=True) + "\n"
