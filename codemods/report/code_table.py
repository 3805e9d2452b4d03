"""The tables of every code in ``docs/codemod.md``, generated from the rules.

    python -m mm_schedule.codemods.report.code_table docs/codemod.md

rewrites the blocks between the ``<!-- codes:begin -->`` / ``<!-- codes:end -->`` and
``<!-- failures:begin -->`` / ``<!-- failures:end -->`` markers; the tests fail while the
file differs from what this would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .. import rules
from ..rules import fork
from . import suppression
from .failures import FAILURES

BLOCKS = ("codes", "failures")


def _owners() -> dict[str, str]:
    owners = {code: rule.name for rule in rules.RULES for code in rule.codes}
    owners.update({code: "fork check (whole tree)" for code in fork.CODES})
    owners.update({code: "suppression comments" for code in suppression.CODES})
    return owners


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def codes_table() -> str:
    owners = _owners()
    lines = ["| code | name | rule | default | meaning |", "|---|---|---|---|---|"]
    for code, (name, meaning) in rules.CODES.items():
        default = ("off" if code in rules.OFF_BY_DEFAULT
                   else "optional" if code in rules.OPTIONAL else "on")
        lines.append(f"| `{code}` | `{name}` | {owners[code]} | {default} | {_cell(meaning)} |")
    return "\n".join(lines)


def failures_table() -> str:
    lines = ["| code | name | meaning |", "|---|---|---|"]
    lines += [f"| `{code}` | `{name}` | {_cell(meaning)} |" for code, (name, meaning) in FAILURES.items()]
    return "\n".join(lines)


def render(text: str) -> str:
    """``text`` (the docs) with every marked block regenerated; ValueError when a marker
    is missing."""
    for block, table in (("codes", codes_table()), ("failures", failures_table())):
        begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
        if begin not in text or end not in text:
            raise ValueError(f"missing {begin} ... {end} markers")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{table}\n{end}{tail}"
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m mm_schedule.codemods.report.code_table docs/codemod.md",
              file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
