"""The rule table is the one place a rule is registered: its trigger is what the gate
asks, its codes are what reports list, its plan is what the engine runs, in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mm_schedule.codemods import rules
from mm_schedule.codemods.engine.transform import migrate_source
from mm_schedule.codemods.fastpath.gate import Gate
from mm_schedule.codemods.rules.rule import Rule, merge_codes

# One file each rule acts on, and a code the full run must report for it.
SAMPLES = {
    "from-imports": ("from sglang.srt.managers.mm_utils import get_embedding_chunk\n", "MMS001"),
    "module-attributes": ("from sglang.srt.managers import mm_utils\nmm_utils.get_embedding_chunk()\n",
                          "MMS001"),
    "calls": ('import sglang.srt.managers.mm_utils as m\ngetattr(m, "get_embedding_chunk")\n', "MMS001"),
    "module-slots": ('import sys\nsys.modules.setdefault("sglang.srt.managers.mm_utils", None)\n', "MMS013"),
    "star-imports": ("from sglang.srt.managers.mm_utils import *\nget_embedding_chunk()\n", "MMS006"),
    "doc-references": ('def f():\n    """\n    >>> from sglang.srt.managers.mm_utils import '
                       'get_embedding_chunk\n    """\n', "MMS014"),
    "strings": ('path = "sglang/srt/managers/mm_utils.py"\n', "MMS008"),
}


def test_every_rule_but_pruning_has_a_sample():
    assert sorted(SAMPLES) == sorted(r.name for r in rules.RULES if r.name != "prune-bindings")


@pytest.mark.parametrize("rule", [r for r in rules.RULES if r.name in SAMPLES], ids=lambda r: r.name)
def test_each_rules_own_trigger_lets_its_file_through(rule, move_map):
    source, code = SAMPLES[rule.name]
    alone = Gate.for_map(move_map, rules=[rule])
    assert alone.needs_transform(source.encode(), "app"), f"{rule.name}'s trigger misses its own file"
    others = Gate.for_map(move_map, rules=[r for r in rules.RULES if r is not rule])
    outcome = migrate_source(source, move_map, path="t.py", package="app")
    assert code in [f.code for f in outcome.findings]
    if rule.name in ("from-imports", "module-attributes", "star-imports"):
        # no other trigger stands in for these: without theirs the file would be skipped
        assert not others.needs_transform(source.encode(), "app")


def test_pruning_acts_only_on_what_other_rules_rewrote(move_map):
    prune = next(r for r in rules.RULES if r.name == "prune-bindings")
    assert prune is rules.RULES[-1]
    for source, _ in SAMPLES.values():
        assert not Gate.for_map(move_map, rules=[prune]).needs_transform(source.encode(), "app")


def test_a_rule_added_to_the_table_is_asked_by_the_gate_and_run(move_map, monkeypatch):
    seen = []

    def plan(m):
        seen.append(m.facts.path)
        m.report(m.facts.module, "MMS999", "x", "probe rule", False)

    probe = Rule("probe", plan, lambda scan: "mm_utils-probe" in scan.strings, {"MMS999": ("probe", "test")})
    source = 'x = "mm_utils-probe"\n'  # mentions the old module's base name, nothing any rule cares about
    assert migrate_source(source, move_map, path="t.py").findings == []
    monkeypatch.setattr(rules, "RULES", (*rules.RULES, probe))
    monkeypatch.setattr(rules, "DEFAULT_SELECTION", rules.DEFAULT_SELECTION | {"MMS999"})
    outcome = migrate_source(source, move_map, path="t.py")
    assert seen == ["t.py"] and [f.code for f in outcome.findings] == ["MMS999"]


def test_a_rule_cannot_be_made_without_a_trigger():
    with pytest.raises(TypeError):
        Rule("no-trigger", lambda m: None)  # type: ignore[call-arg]


def test_every_code_raised_in_the_package_is_owned_once():
    package = Path(rules.__file__).parent.parent
    raised = set()
    for path in package.rglob("*.py"):
        raised.update(re.findall(r'"(MMS0\d\d)"', path.read_text("utf-8")))
    assert raised and sorted(raised) == sorted(rules.CODES)
    owned = [c for r in rules.RULES for c in r.codes]
    assert len(owned) == len(set(owned))
    with pytest.raises(ValueError, match="MMS001 is owned by two rules"):
        merge_codes({"MMS001": ("a", "b")}, {"MMS001": ("c", "d")})


def test_each_code_is_defined_once_in_the_file_of_the_rule_that_owns_it():
    """A code's name and meaning are written where its rule is: the rule's own file (or,
    for the codes settled outside a file's rules, the fork check and the suppressions)."""
    from mm_schedule.codemods.report import suppression
    from mm_schedule.codemods.rules import fork

    package = Path(rules.__file__).parent.parent
    definitions: dict[str, list[str]] = {}
    for path in package.rglob("*.py"):
        for code in re.findall(r'^\s*"(MMS0\d\d)": \(', path.read_text("utf-8"), re.M):
            definitions.setdefault(code, []).append(path.relative_to(package).as_posix())
    owners = {code: f"rules/{Path(rule.plan.__code__.co_filename).name}"
              for rule in rules.RULES for code in rule.codes}
    owners.update({code: "rules/fork.py" for code in fork.CODES})
    owners.update({code: "report/suppression.py" for code in suppression.CODES})
    assert sorted(owners) == sorted(rules.CODES)
    for code in rules.CODES:
        # suppression.py names its code through a constant
        expected = [] if owners[code] == "report/suppression.py" else [owners[code]]
        assert definitions.get(code, []) == expected, code
    assert rules.CODES[suppression.UNUSED] == suppression.CODES[suppression.UNUSED]
    core = {"MMS001", "MMS002", "MMS003", "MMS009", "MMS010"}
    assert {owners[c] for c in core} == {"rules/from_imports.py"}
    assert "MMS0" not in (package / "report" / "reporter.py").read_text("utf-8")


def test_the_docs_table_of_codes_is_generated_from_the_rules(monkeypatch):
    from mm_schedule.codemods.report import code_table

    docs = Path(__file__).resolve().parents[2] / "docs" / "codemod.md"
    text = docs.read_text("utf-8")
    assert code_table.render(text) == text, (
        "docs/codemod.md is stale: run python -m mm_schedule.codemods.report.code_table docs/codemod.md")
    for code, (name, _) in rules.CODES.items():
        assert f"| `{code}` | `{name}` |" in text
    # a change to the rules shows: the table would be written differently
    monkeypatch.setattr(rules, "CODES", {**rules.CODES, "MMS001": ("renamed", "x")})
    assert code_table.render(text) != text
