"""``-`` reads one file from stdin, for editors and pre-commit, like ruff: the result on
stdout with ``--write``, ``--stdin-filename`` for the package, settings and messages."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from mm_schedule.codemods import cli

USE = b"from .mm_utils import get_embedding_chunk\n"


@pytest.fixture
def package(tree):
    managers = tree / "sglang" / "srt" / "managers"
    managers.mkdir(parents=True)
    for folder in (tree / "sglang", tree / "sglang" / "srt", managers):
        (folder / "__init__.py").write_text("")
    return managers


def _main(monkeypatch, data: bytes, *args: str) -> int:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    return cli.main(["-", *args, "-j", "1"])


def test_write_puts_the_result_on_stdout_and_the_findings_on_stderr(package, monkeypatch, capsysbinary):
    status = _main(monkeypatch, USE, "--write", "--stdin-filename", "sglang/srt/managers/x.py")
    out, err = capsysbinary.readouterr()
    assert status == 0
    assert out == b"from .mm_schedule import get_embedding_chunk\n"  # the package came from the name
    assert b"sglang/srt/managers/x.py:1:23: MMS001 [fixed]" in err
    assert not (package / "x.py").exists()  # nothing is written


def test_without_a_name_relative_imports_are_unknown_and_the_source_comes_back(tree, monkeypatch, capsysbinary):
    assert _main(monkeypatch, USE, "--write") == 0
    out, err = capsysbinary.readouterr()
    assert out == USE and b"0 findings" in err


def test_check_and_diff_report_on_stdout_like_for_a_file(package, monkeypatch, capsysbinary):
    name = "sglang/srt/managers/x.py"
    assert _main(monkeypatch, USE, "--stdin-filename", name) == 1
    out, _ = capsysbinary.readouterr()
    assert out.decode().startswith(f"{name}:1:23: MMS001 [fixable]")
    assert _main(monkeypatch, USE, "--diff", "--stdin-filename", name) == 1
    out, _ = capsysbinary.readouterr()
    assert b"\n--- a/sglang/srt/managers/x.py\n+++ b/sglang/srt/managers/x.py\n" in out
    assert b"+from .mm_schedule import get_embedding_chunk\n" in out


def test_the_settings_of_the_named_file_apply(tree, map_file, monkeypatch, capsysbinary):
    sub = tree / "sub"
    sub.mkdir()
    (sub / "pyproject.toml").write_text(
        f'[tool.mm-schedule-codemod]\nmap = "{map_file}"\nextend-exclude = ["gen_*.py"]\n')
    data = b"from sglang.srt.managers.mm_utils import old_helper\n"  # removed in the test map only
    assert _main(monkeypatch, data, "--stdin-filename", "sub/a.py") == 1
    assert b"MMS009" in capsysbinary.readouterr().out
    # excluded only with force-exclude, as for a file named on the command line
    assert _main(monkeypatch, data, "--write", "--stdin-filename", "sub/gen_a.py", "--force-exclude") == 0
    out, err = capsysbinary.readouterr()
    assert out == data and b"0 files" not in err


def test_an_unparsable_source_comes_back_unchanged_with_status_2(tree, monkeypatch, capsysbinary):
    data = b"from sglang.srt.managers.mm_utils import get_embedding_chunk\nx = (\n"
    assert _main(monkeypatch, data, "--write", "--stdin-filename", "a.py") == 2
    out, err = capsysbinary.readouterr()
    assert out == data and b"a.py: MMS906 [error] cannot parse" in err


def test_a_json_report_names_the_stdin_file(tree, monkeypatch, capsysbinary):
    report = tree.parent / "r.json"
    data = b"from sglang.srt.managers.mm_utils import get_embedding_chunk\n"
    assert _main(monkeypatch, data, "--write", "--stdin-filename", "a.py", "--json", str(report)) == 0
    doc = json.loads(report.read_text())
    assert [(f["path"], f["code"], f["status"]) for f in doc["findings"]] == [("a.py", "MMS001", "fixed")]


@pytest.mark.parametrize("args, message", [
    (["-", "a.py"], "'-' (standard input) cannot be combined with other paths"),
    (["a.py", "--stdin-filename", "a.py"], "--stdin-filename names the source read from '-'"),
    (["-", "--stdin-filename", ""], "empty --stdin-filename"),
    (["-", "--write", "--json", "-"], "--json - and --write - both write to stdout"),
])
def test_wrong_combinations_are_usage_errors(tree, args, message, capsys):
    assert cli.main(args) == 3
    assert message in capsys.readouterr().err


def test_an_editor_pipes_a_buffer_through_the_installed_command(package):
    done = subprocess.run(
        [sys.executable, "-m", "mm_schedule.codemods", "-", "--write", "--stdin-filename",
         "sglang/srt/managers/x.py"], input=USE, capture_output=True, cwd=package.parents[2], timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"from .mm_schedule import get_embedding_chunk\n"
