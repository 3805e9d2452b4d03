"""Jupyter notebooks: the code cells are migrated as one module, so that an import
in one cell and its use in a later one are seen together.

IPython syntax (``%magic``, ``!shell``, ``x = %time f()``, ``obj?``) is swapped for a
placeholder statement before parsing and put back afterwards; cells that start
with a cell magic (``%%bash``) are not Python and are left alone. A notebook is
only written when its JSON text can be reproduced exactly (same indentation, key
order, escaping), so that the diff shows the edited source lines and nothing else;
otherwise it is reported, not written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, replace

from ..fastpath.gate import Gate
from ..movemap.schema import MoveMap
from .transform import migrate_source

_MARK = "__mm_schedule_codemod_cell__"
_MARK_LINE = re.compile(rf"^{_MARK}\((\d+)\)\n", re.MULTILINE)
_LINES = re.compile(r"[^\n]*\n|[^\n]+$")  # like nbformat: split at "\n" only
_MAGIC_NAME = "__mm_schedule_codemod_magic_{}__"
_MAGIC_NAME_LINE = re.compile(r"^([ \t]*)__mm_schedule_codemod_magic_(\d+)__$")
# A line IPython rewrites before Python sees it.
_IPYTHON_LINE = re.compile(r"^\s*(?:[%!]|[\w.,\s\[\]]+=\s*[%!])|\?\??\s*$")


class NotebookError(ValueError):
    """The file is not a notebook this tool can read or write back."""


@dataclass
class NotebookOutcome:
    new_source: bytes | None
    findings: list  # Finding, with line/column inside its cell
    cells: list[int]  # per finding: the 1-based cell number (counting every cell)
    note: str | None = None  # why a notebook with changes was not written


def _cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _cells(notebook) -> list[dict]:
    """The notebook's cells, checked to have the shape nbformat gives them."""
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise NotebookError("not a readable notebook: expected a JSON object with a list of "
                            "'cells'")
    for number, cell in enumerate(notebook["cells"], 1):
        if not isinstance(cell, dict):
            raise NotebookError(f"not a readable notebook: cell {number} is not a JSON object")
        source = cell.get("source", "")
        if not (isinstance(source, str) or (
                isinstance(source, list) and all(isinstance(piece, str) for piece in source))):
            raise NotebookError(f"not a readable notebook: cell {number}: 'source' must be a "
                                "string or a list of strings")
    return notebook["cells"]


def _mask(text: str, magics: list[str]) -> str:
    out = []
    continued = False
    for line in text.split("\n"):
        if continued or _IPYTHON_LINE.search(line):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + _MAGIC_NAME.format(len(magics)))
            magics.append(line)
            continued = line.endswith("\\")
        else:
            out.append(line)
    return "\n".join(out)


def _unmask(text: str, magics: list[str]) -> str:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        found = _MAGIC_NAME_LINE.match(line)
        if found:
            lines[i] = magics[int(found.group(2))]
    return "\n".join(lines)


def _layout(text: str, notebook: dict) -> dict | None:
    """json.dumps arguments that reproduce ``text`` exactly, or None."""
    for indent in (1, 2, 4, None, 3):
        for sort_keys in (True, False):
            for ensure_ascii in (False, True):
                options = {"indent": indent, "sort_keys": sort_keys, "ensure_ascii": ensure_ascii}
                dumped = json.dumps(notebook, **options)
                for end in ("\n", ""):
                    if dumped + end == text:
                        return {**options, "end": end}
    return None


def migrate_notebook(
    source: bytes, move_map: MoveMap, *, path: str, package: str | None, gate: Gate,
    report_unused_suppressions: bool = False, selected: Collection[str] | None = None,
) -> NotebookOutcome:
    try:
        text = source.decode("utf-8")
        notebook = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise NotebookError(f"not a readable notebook: {exc}") from exc
    cells = _cells(notebook)
    metadata = notebook.get("metadata")
    info = metadata.get("language_info") if isinstance(metadata, dict) else None
    language = info.get("name", "python") if isinstance(info, dict) else "python"
    if language != "python" or not (gate.mentions(source) or report_unused_suppressions):
        return NotebookOutcome(None, [], [])
    magics: list[str] = []
    parts, starts = [], {}  # starts: cell index -> first line (1-based) of its code
    line = 1
    for index, cell in enumerate(cells):
        code = _cell_text(cell)
        if cell.get("cell_type") != "code" or code.lstrip().startswith("%%"):
            continue
        masked = _mask(code, magics)
        if not masked.endswith("\n"):
            masked += "\n"
        parts.append(f"{_MARK}({index})\n{masked}")
        starts[index] = line + 1
        line += 1 + masked.count("\n")
    module = "".join(parts)
    outcome = migrate_source(module, move_map, path=path, package=package, gate=gate,
                             report_unused_suppressions=report_unused_suppressions,
                             selected=selected)
    findings, numbers = [], []
    ordered = sorted(starts.items(), key=lambda item: item[1])
    for finding in outcome.findings:
        # A finding without a position of its own (line 1) belongs to the first cell.
        index, first = max((c for c in ordered if c[1] <= finding.line),
                           key=lambda c: c[1], default=ordered[0])
        findings.append(replace(finding, line=max(1, finding.line - first + 1)))
        numbers.append(index + 1)
    if outcome.new_source is None:
        return NotebookOutcome(None, findings, numbers)
    layout = _layout(text, notebook)
    if layout is None:
        return NotebookOutcome(None, findings, numbers,
                               note="its JSON layout cannot be reproduced; not written")
    new_module = outcome.new_source.decode("utf-8")
    pieces = _MARK_LINE.split(new_module)
    if [int(p) for p in pieces[1::2]] != list(starts):
        return NotebookOutcome(None, findings, numbers,
                               note="the migrated cells could not be told apart; not written")
    if len(pieces) > 2:
        pieces[2] = pieces[0] + pieces[2]  # anything placed above the first cell belongs to it
    for position in range(1, len(pieces), 2):
        index, new_code = int(pieces[position]), _unmask(pieces[position + 1], magics)
        old_code = _cell_text(cells[index])
        if not old_code.endswith("\n"):
            new_code = new_code[:-1] if new_code.endswith("\n") else new_code
        if new_code != old_code:
            as_list = isinstance(cells[index].get("source"), list)
            cells[index]["source"] = _LINES.findall(new_code) if as_list else new_code
    end = layout.pop("end")
    return NotebookOutcome((json.dumps(notebook, **layout) + end).encode("utf-8"), findings, numbers)
