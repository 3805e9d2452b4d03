"""The shapes a run's findings can be printed in (``--output-format``), as ruff names them.

* ``text`` (default): ``path:line:col: CODE [status] message``, one line each.
* ``concise``: ruff's concise lines, ``path:line:col: CODE [*] message``, where ``[*]``
  marks what the codemod fixes.
* ``json``: the JSON report (``--json``'s document) on stdout.
* ``github``: GitHub Actions workflow commands, ``::error title=...,file=...,line=...,
  col=...::message``, which the Actions runner shows as annotations on the diff.
* ``sarif``: a SARIF 2.1.0 log (GitHub code scanning, IDE viewers): one rule per code,
  one result per finding, the files that could not be processed as notifications.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

from ..rules import CODES
from .failures import FAILURES
from .run_report import RunReport, printable

FORMATS = ("text", "concise", "json", "github", "sarif")
DOCUMENTS = frozenset({"json", "sarif"})  # formats that are one document, not lines
TOOL = "mm-schedule-codemod"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def finding_lines(report: RunReport, fmt: str) -> list[str]:
    """The lines ``fmt`` prints for the findings (``text``, ``concise``, ``github``)."""
    if fmt == "text":
        return [line for result in report.results for line in result.finding_lines()]
    out = []
    for result in report.results:
        for entry in result.finding_dicts():
            where = result.shown if entry.get("cell") is None else f"{result.shown}:cell {entry['cell']}"
            state = entry["status"]
            if fmt == "concise":
                mark = " [*]" if state != "manual" else ""
                out.append(printable(f"{where}:{entry['line']}:{entry['column']}: "
                                     f"{entry['code']}{mark} {entry['message']}"))
            else:
                out.append(_github(result.shown, entry, state, _fails(report, entry)))
    return out


def installed_version() -> str:
    # From the installed distribution's metadata: importing mm_schedule would load torch,
    # which the codemod does not need.
    from importlib import metadata

    try:
        return metadata.version("mm-schedule")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _fails(report: RunReport, entry: dict) -> bool:
    """Whether a finding fails the check: not a fix already on disk, nor an optional
    rewrite no selector named."""
    return entry["status"] != "fixed" and entry["code"] not in report.optional


def _github(path: str, entry: dict, state: str, fails: bool) -> str:
    # what does not fail the check (a fix on disk, an optional rewrite) is news, not a problem
    level = "error" if fails else "notice"
    title = _escape_property(f"{TOOL} ({entry['code']})")
    where = ",".join((f"file={_escape_property(printable(path))}", f"line={entry['line']}",
                      f"col={entry['column']}"))
    message = _escape_data(printable(f"{path}:{entry['line']}:{entry['column']}: {entry['code']} "
                                     f"[{state}] {entry['message']}"))
    return f"::{level} title={title},{where}::{message}"


def github_failure_lines(report: RunReport) -> list[str]:
    return [f"::error title={_escape_property(f'{TOOL} ({failure.code})')},"
            f"file={_escape_property(printable(path))}::"
            f"{_escape_data(printable(failure.render(path)))}"
            for path, failure in report.failures()]


def _uri(path: str) -> str:
    """A SARIF artifact URI: relative paths percent-encoded (against ``%SRCROOT%``),
    absolute ones as ``file://`` URIs."""
    if os.path.isabs(path):
        return Path(path).as_uri()
    return quote(printable(path).replace(os.sep, "/"), safe="/")


def sarif(report: RunReport) -> str:
    """The report as a SARIF 2.1.0 log."""
    codes = list(CODES)
    rules = [{
        "id": code,
        "name": name,
        "shortDescription": {"text": summary},
        "fullDescription": {"text": summary},
        "defaultConfiguration": {"level": "error"},
    } for code, (name, summary) in CODES.items()]
    results = []
    for result in report.results:
        for entry in result.finding_dicts():
            state = entry["status"]
            item = {
                "ruleId": entry["code"],
                "ruleIndex": codes.index(entry["code"]) if entry["code"] in codes else -1,
                "level": "error" if _fails(report, entry) else "note",
                "message": {"text": printable(entry["message"])},
                "locations": [{"physicalLocation": {
                    "artifactLocation": _artifact(result.shown),
                    "region": {"startLine": entry["line"], "startColumn": entry["column"]},
                }}],
                "properties": {"status": state, "symbol": printable(entry["symbol"])},
            }
            if item["ruleIndex"] < 0:
                del item["ruleIndex"]
            if entry.get("cell") is not None:
                item["properties"]["cell"] = entry["cell"]
            results.append(item)
    notifications = [{
        "level": "error",
        "message": {"text": printable(failure.message)},
        "descriptor": {"id": failure.code, "name": FAILURES[failure.code][0]},
        "locations": [{"physicalLocation": {"artifactLocation": _artifact(path)}}],
    } for path, failure in report.failures()]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": TOOL,
                "version": installed_version(),
                "rules": rules,
            }},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri() + "/"}},
            "invocations": [{
                "executionSuccessful": not notifications,
                "toolExecutionNotifications": notifications,
            }],
            "results": results,
        }],
    }
    return json.dumps(log, indent=2, ensure_ascii=True) + "\n"


def _artifact(path: str) -> dict:
    location = {"uri": _uri(path)}
    if not os.path.isabs(path):
        location["uriBaseId"] = "%SRCROOT%"
    return location
