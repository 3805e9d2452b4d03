"""``--output-format``: ruff's names and shapes for text, concise, json, github and SARIF
output; and a parse error names one position."""

from __future__ import annotations

import json

import pytest

MIXED = ("from sglang.srt.managers.mm_utils import get_embedding_chunk\n"
         "from sglang.srt.managers.mm_utils import old_helper\n")


@pytest.fixture
def files(tree):
    (tree / "a b.py").write_text(MIXED)  # a space: escaped in URIs
    (tree / "broken.py").write_text("from sglang.srt.managers.mm_utils import x\ndef f(:\n    pass\n")
    return tree


def test_concise_lines_mark_what_is_fixed(files, map_file, cli_main, capsys):
    assert cli_main(".", "--output-format", "concise", map_file=map_file) == 2
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "a b.py:1:42: MMS001 [*] import: 'get_embedding_chunk' moved to sglang.srt.managers.mm_schedule",
        "a b.py:2:42: MMS009 'old_helper' was removed from sglang.srt.managers.mm_utils and has "
        "no new home; rewrite this use by hand",
    ]


def test_github_annotations(files, map_file, cli_main, capsys):
    assert cli_main(".", "--output-format", "github", map_file=map_file) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("::error title=mm-schedule-codemod (MMS001),file=a b.py,line=1,col=42::"
                      "a b.py:1:42: MMS001 [fixable] import: 'get_embedding_chunk' moved to "
                      "sglang.srt.managers.mm_schedule")
    assert out[1].startswith("::error title=mm-schedule-codemod (MMS009),file=a b.py,line=2,col=42::")
    assert out[2].startswith("::error title=mm-schedule-codemod (MMS906),file=broken.py::"
                             "broken.py: MMS906 [error] cannot parse: line 2, column 7")
    assert len(out) == 3
    # a fix on disk is a notice, not an error
    assert cli_main("--write", "a b.py", "--output-format", "github", map_file=map_file) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("::notice title=mm-schedule-codemod (MMS001),")
    assert out[1].startswith("::error title=mm-schedule-codemod (MMS009),")


def test_github_escapes_what_would_end_a_property_or_the_message(tree, map_file, cli_main, capsys):
    (tree / "a,b:c%.py").write_text(MIXED)
    cli_main(".", "--output-format", "github", map_file=map_file)
    line = capsys.readouterr().out.splitlines()[0]
    assert "file=a%2Cb%3Ac%25.py,line=1" in line and "::a,b:c%25.py:1:42: MMS001" in line


def test_json_format_is_the_report_on_stdout(files, map_file, cli_main, capsys):
    assert cli_main(".", "--output-format", "json", map_file=map_file) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["tool"] == "mm-schedule-codemod"
    assert [(f["code"], f["status"]) for f in doc["findings"]] == [("MMS001", "fixable"), ("MMS009", "manual")]
    assert [f["code"] for f in doc["failed_files"]] == ["MMS906"]


def test_sarif_2_1_0(files, map_file, cli_main, capsys):
    from mm_schedule.codemods import rules

    assert cli_main(".", "--output-format", "sarif", map_file=map_file) == 2
    log = json.loads(capsys.readouterr().out)
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "mm-schedule-codemod" and driver["version"]
    assert [r["id"] for r in driver["rules"]] == list(rules.CODES)
    assert all(r["shortDescription"]["text"] and r["name"] for r in driver["rules"])
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == files.as_uri() + "/"
    results = run["results"]
    assert [(r["ruleId"], r["level"], r["properties"]["status"]) for r in results] == [
        ("MMS001", "error", "fixable"), ("MMS009", "error", "manual")]
    for result in results:
        assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["message"]["text"]
        (location,) = result["locations"]
        physical = location["physicalLocation"]
        assert physical["artifactLocation"] == {"uri": "a%20b.py", "uriBaseId": "%SRCROOT%"}
        assert physical["region"]["startLine"] >= 1 and physical["region"]["startColumn"] >= 1
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    (note,) = invocation["toolExecutionNotifications"]
    assert note["descriptor"]["id"] == "MMS906" and note["level"] == "error"
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "broken.py"


@pytest.mark.parametrize("fmt", ["json", "sarif"])
@pytest.mark.parametrize("clash", [["--diff"], ["--json", "-"]])
def test_document_formats_refuse_to_share_stdout(tree, map_file, cli_main, capsys, fmt, clash):
    (tree / "a.py").write_text(MIXED)
    assert cli_main(".", "--output-format", fmt, *clash, map_file=map_file) == 3
    assert "both write to stdout" in capsys.readouterr().err


def test_an_unknown_format_is_a_usage_error(tree, map_file, cli_main, capsys):
    assert cli_main(".", "--output-format", "grouped", map_file=map_file) == 3
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("source, position", [
    ("def f(:\n    pass\n", "line 3, column 7"),  # libcst gives up on the next line
    ("x = (1,\n", "line 3, column 5"),
    ("if x:\npass\n", "line 4, column 1"),
])
def test_a_parse_error_names_one_position_where_python_does(tree, map_file, cli_main, capsys,
                                                            source, position):
    (tree / "a.py").write_text("from sglang.srt.managers.mm_utils import x\n\n" + source)
    assert cli_main(".", map_file=map_file) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "MMS906" in line]
    assert f"cannot parse: {position}: " in line
    assert line.count(", column ") == 1 and "error at" not in line
