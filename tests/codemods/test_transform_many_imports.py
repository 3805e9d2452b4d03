"""Many one-name from-imports of the old module, all merged into one statement of the new
module: the rule must do a bounded amount of work per import line (it once rebuilt and
measured the growing statement for every line), and the merged statement must hold every
name once, in isort's order when its names were sorted, in black's layout."""

from __future__ import annotations

import ast
import dataclasses
import os
import random
import sys

import pytest

from mm_schedule.codemods import rules
from mm_schedule.codemods.engine.transform import migrate_source
from mm_schedule.codemods.rules import from_imports as plan_imports

OLD = "sglang.srt.managers.mm_utils"
NEW = "sglang.srt.managers.mm_schedule"

NAMES = [
    "get_embedding_chunk", "PerImageRequestInfo", "get_embedding_and_mask",
    "init_mm_embedding_cache", "_get_multimodal_mask", "_adjust_embedding_length", "_is_hip",
]

# what the new module's statement says before the merge (None: there is none, the first
# old import is retargeted and the rest merge into it)
TARGETS = {
    "sorted": f"from {NEW} import PerImageRequestInfo, get_embedding_chunk",
    "unsorted": f"from {NEW} import get_embedding_chunk, PerImageRequestInfo",
    "none": None,
}


def _source(target: str | None, imported: list[tuple[str, str]]) -> str:
    lines = [target] if target else []
    lines += [f"from {OLD} import {name} as {asname}" for name, asname in imported]
    uses = ", ".join(asname for _, asname in imported)
    return "\n".join(lines) + f"\n\nvalues = [{uses}]\n"


def _draw(rng: random.Random, n: int) -> list[tuple[str, str]]:
    return [(rng.choice(NAMES), f"c{i}_{rng.randrange(1000)}") for i in range(n)]


def _isort_order(name: str) -> tuple[int, str]:
    # isort's default order of imported names: CONSTANTS, Classes, then the rest
    if len(name) > 1 and name.isupper():
        return (0, name)
    return (1, name) if name[:1].isupper() else (2, name)


def _imports_from(tree: ast.Module, module: str) -> list[ast.ImportFrom]:
    return [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == module]


@pytest.mark.parametrize("shape", list(TARGETS))
def test_every_name_lands_once_in_one_wrapped_statement(shape, move_map):
    seed = int.from_bytes(os.urandom(4), "little")
    imported = _draw(random.Random(seed), 150)
    source = _source(TARGETS[shape], imported)
    outcome = migrate_source(source, move_map, path="t.py")
    assert outcome.new_source is not None, f"seed {seed}"
    text = outcome.new_source.decode()
    tree = ast.parse(text)

    assert _imports_from(tree, OLD) == [], f"seed {seed}"
    [merged] = _imports_from(tree, NEW)
    got = [(a.name, a.asname) for a in merged.names]
    existing = [(a.name, a.asname) for a in _imports_from(ast.parse(TARGETS[shape] or ""), NEW)
                for a in a.names]
    if shape == "unsorted":
        expected = existing + imported  # appended in the order they were read
    else:
        # each merged name goes where isort puts it, after names that sort the same
        incoming = existing + imported if existing else imported
        expected = sorted(incoming, key=lambda pair: _isort_order(pair[0]))
    assert got == expected, f"seed {seed}"

    # black's layout: one name a line, indented four spaces, trailing commas
    rendered = "".join(f"    {name}{f' as {asname}' if asname else ''},\n" for name, asname in expected)
    assert f"from {NEW} import (\n{rendered})\n" in text, f"seed {seed}"
    assert text.endswith(source[source.index("\n\nvalues"):]), "code after the imports changed"
    assert migrate_source(text, move_map, path="t.py").new_source is None, "second run changed the file"


def _work(source: str, move_map, monkeypatch) -> dict[str, int]:
    """How often the from-import rule built or measured an import statement, and how many
    Python and builtin calls it made, for one migration of ``source``."""
    counts = {"built": 0, "measured": 0, "calls": 0}

    def counting(key, real):
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(plan_imports, "with_aliases", counting("built", plan_imports.with_aliases))
    monkeypatch.setattr(plan_imports, "_width", counting("measured", plan_imports._width))
    rule = rules.RULES[0]
    assert rule.plan is plan_imports.plan_from_imports

    def count_calls(frame, event, arg):
        if event in ("call", "c_call"):
            counts["calls"] += 1

    def profiled(m):
        sys.setprofile(count_calls)
        try:
            rule.plan(m)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(rules, "RULES", (dataclasses.replace(rule, plan=profiled), *rules.RULES[1:]))
    assert migrate_source(source, move_map, path="t.py").new_source is not None
    monkeypatch.undo()
    return counts


@pytest.mark.parametrize("shape", list(TARGETS))
def test_work_per_import_line_does_not_grow_with_the_file(shape, move_map, monkeypatch):
    imported = _draw(random.Random(), 200)
    small = _work(_source(TARGETS[shape], imported[:50]), move_map, monkeypatch)
    large = _work(_source(TARGETS[shape], imported), move_map, monkeypatch)
    # the merged statement is built and measured while it fits on one line, then once
    # more at the end: as often for 200 lines as for the same first 50
    assert large["built"] == small["built"]
    assert large["measured"] == small["measured"]
    # four times the lines, about four times the calls (a per-line rescan made it ~15)
    assert large["calls"] < 5 * small["calls"], (small, large)
