"""A rewrite the old module's re-export makes optional has its own code (MMS017):
``--write`` applies it, ``--check`` and ``--diff`` show it and pass unless a selector
names the code; ``--ignore`` drops it; anything else in the same run still fails them."""

from __future__ import annotations

import json

import pytest

from mm_schedule.codemods import rules
from mm_schedule.codemods.report.findings import Finding
from mm_schedule.codemods.report.run_report import FileResult, RunReport
from mm_schedule.codemods.rules import CODES, from_imports

OPTIONAL = "from sglang.srt.managers.mm_utils import init_mm_embedding_cache\n"
REQUIRED = "from sglang.srt.managers.mm_utils import get_embedding_chunk\n"
NEW = "sglang.srt.managers.mm_schedule"


def test_the_code_is_defined_by_its_rule_and_optional():
    code = from_imports.REEXPORTED
    assert CODES[code] == from_imports.CODES[code]
    assert from_imports.RULE.optional == {code} and "MMS001" not in rules.OPTIONAL


@pytest.mark.parametrize("mode", ["--check", "--diff"])
def test_an_optional_rewrite_alone_passes_check_and_diff(tree, map_file, cli_main, capsys, mode):
    (tree / "a.py").write_text(OPTIONAL)
    assert cli_main(mode, ".", map_file=map_file) == 0
    out, err = capsys.readouterr()
    if mode == "--diff":  # the diff on stdout, the findings on stderr
        assert f"+from {NEW} import init_mm_embedding_cache" in out
        out = err
    assert "a.py:1:42: MMS017 [fixable]" in out and "still re-exports it" in out
    assert (tree / "a.py").read_text() == OPTIONAL


def test_write_applies_it(tree, map_file, cli_main, capsys):
    (tree / "a.py").write_text(OPTIONAL + "import sglang.srt.managers.mm_utils as mu\n"
                                          "mu.get_embedding_and_mask()\n")
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert (tree / "a.py").read_text() == (f"from {NEW} import init_mm_embedding_cache\n"
                                           f"import {NEW} as mu\nmu.get_embedding_and_mask()\n")
    assert capsys.readouterr().out.count("MMS017 [fixed]") == 2
    assert cli_main("--check", ".", map_file=map_file) == 0


def test_a_required_rewrite_beside_it_still_fails_check(tree, map_file, cli_main, tmp_path):
    (tree / "a.py").write_text(OPTIONAL)
    (tree / "b.py").write_text(REQUIRED)
    report = tmp_path / "r.json"
    assert cli_main("--check", ".", "--json", report, map_file=map_file) == 1
    codes = sorted((f["path"], f["code"]) for f in json.loads(report.read_text())["findings"])
    assert codes == [("a.py", "MMS017"), ("b.py", "MMS001")]


def test_selected_it_fails_check():
    """What a selection of the code (``optional`` without it) makes of the same result."""
    result = FileResult("a.py", old=b"x", new=b"y")
    result.findings = [_finding(from_imports.REEXPORTED)]
    lenient = RunReport("check", {}, [result], 1, 1, [], [])
    assert not lenient.fails_check()
    assert RunReport("check", {}, [result], 1, 1, [], [], optional=frozenset()).fails_check()
    result.findings = []  # a change no finding accounts for is never optional
    assert lenient.fails_check()


@pytest.mark.parametrize("selection", [["--extend-select", "MMS017"], ["--select", "MMS01"],
                                       ["--select", "ALL"], ["--extend-select", "MMS"]])
def test_a_selector_naming_it_makes_check_fail(tree, map_file, cli_main, capsys, selection):
    (tree / "a.py").write_text(OPTIONAL)
    assert cli_main("--check", ".", *selection, map_file=map_file) == 1
    assert "MMS017" in capsys.readouterr().out


def test_the_settings_naming_it_make_check_fail(tree, map_file, cli_main):
    (tree / "a.py").write_text(OPTIONAL)
    (tree / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nextend-select = ["MMS017"]\n')
    assert cli_main("--check", ".", map_file=map_file) == 1
    # a selector that does not name it leaves it optional
    (tree / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nextend-select = ["MMS016"]\n')
    assert cli_main("--check", ".", map_file=map_file) == 0


def test_ignored_it_is_neither_applied_nor_reported(tree, map_file, cli_main, capsys):
    (tree / "a.py").write_text(OPTIONAL)
    assert cli_main("--write", ".", "--ignore", "MMS017", map_file=map_file) == 0
    assert (tree / "a.py").read_text() == OPTIONAL
    assert "MMS017" not in capsys.readouterr().out
    # selecting only other codes leaves it out too
    assert cli_main("--write", ".", "--select", "MMS001", map_file=map_file) == 0
    assert (tree / "a.py").read_text() == OPTIONAL


def test_the_json_report_names_the_release_the_run_aimed_at(tree, tmp_path):
    from mm_schedule.codemods import cli
    from mm_schedule.codemods.movemap.schema import load_map

    (tree / "a.py").write_text(OPTIONAL)
    report = tmp_path / "r.json"
    newest = load_map(aimed=False).releases[-1]
    for extra, aimed in (([], newest), (["--target-version", "0.5.18"], "0.5.18")):
        cli.main(["--check", ".", "--json", str(report), "-j", "1", *extra])
        assert json.loads(report.read_text())["map"]["target_version"] == aimed


def test_github_and_sarif_levels_follow_the_check(tree, map_file, cli_main, capsys):
    """An optional rewrite is a notice while it does not fail the check, an error once named."""
    (tree / "a.py").write_text(OPTIONAL)
    (tree / "b.py").write_text(REQUIRED)
    assert cli_main("--check", ".", "--output-format", "github", map_file=map_file) == 1
    levels = {line.split("(")[1][:6]: line.split(" ")[0]
              for line in capsys.readouterr().out.splitlines() if line.startswith("::")}
    assert levels == {"MMS017": "::notice", "MMS001": "::error"}
    assert cli_main("--check", ".", "--output-format", "sarif", "--extend-select", "MMS017",
                    map_file=map_file) == 1
    results = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    assert sorted((r["ruleId"], r["level"]) for r in results) == [("MMS001", "error"),
                                                                  ("MMS017", "error")]
    assert cli_main("--check", ".", "--output-format", "sarif", map_file=map_file) == 1
    results = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    assert sorted((r["ruleId"], r["level"]) for r in results) == [("MMS001", "error"),
                                                                  ("MMS017", "note")]


def test_a_suppression_holds_it_back(tree, map_file, cli_main):
    source = OPTIONAL.rstrip("\n") + "  # mm-schedule-codemod: ignore[MMS017]\n"
    (tree / "a.py").write_text(source)
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert (tree / "a.py").read_text() == source


def _finding(code: str) -> Finding:
    return Finding("a.py", 1, 1, code, "init_mm_embedding_cache", "m", True)
