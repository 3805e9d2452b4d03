"""Inputs refused before anything is read or written (exit 3), and reports that say
only what happened: pure JSON on stdout, fixable vs fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mm_schedule.codemods import cli

MOVING = "from sglang.srt.managers.mm_utils import get_embedding_chunk, hash_feature\n"
MANUAL = '@patch("sglang.srt.managers.mm_utils.get_embedding_and_mask")\ndef t(m):\n    pass\n'


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.py").write_text(MOVING)
    monkeypatch.chdir(root)
    return root


@pytest.mark.parametrize(
    "map_text, message",
    [
        ("{not json", "is not valid JSON"),
        ('{"old_module": "a.b"}', "missing required key"),
        ("[1, 2]", "expected a JSON object"),
        ('{"old_module": "a.b", "new_module": "a.b", "moved": {}}',
         "new_module is the same as old_module"),
        ('{"old_module": "a.b-c", "new_module": "a.d", "moved": {}}', "not a dotted module name"),
        ('{"old_module": "a.b", "new_module": "a.class", "moved": {}}',
         "new_module: 'a.class' is not a dotted module name"),
        ('{"old_module": "a.b", "new_module": "a.c", "moved": {"2x": '
         '{"kind": "function", "private": false}}}', "moved: '2x' is not a Python name"),
        ('{"old_module": "a.b", "new_module": "a.c", "moved": {"lambda": '
         '{"kind": "function", "private": false}}}', "moved: 'lambda' is not a Python name"),
        ('{"old_module": "a.b", "new_module": "a.c", "moved": {}, '
         '"import_origins": {"f": "a.b"}}', "import_origins['f'] is the old module itself"),
    ],
    ids=["not-json", "missing-keys", "not-an-object", "target-is-source", "bad-module-name",
         "keyword-module", "bad-name", "keyword-name", "origin-is-source"],
)
def test_a_malformed_map_is_refused_before_any_file_is_touched(tree, capsys, map_text, message):
    bad = tree.parent / "bad.json"
    bad.write_text(map_text)
    assert cli.main(["--write", ".", "--map", str(bad)]) == 3
    assert (tree / "a.py").read_text() == MOVING
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["under_a_file", "missing_folder", "a_folder"])
def test_an_unwritable_json_path_is_refused_before_any_file_is_touched(tree, map_file, capsys,
                                                                       where):
    (tree.parent / "plain.txt").write_text("")
    (tree.parent / "folder").mkdir()
    target = {"under_a_file": tree.parent / "plain.txt" / "r.json",
              "missing_folder": tree.parent / "nowhere" / "r.json",
              "a_folder": tree.parent / "folder"}[where]
    assert cli.main(["--write", ".", "--json", str(target), "--map", str(map_file)]) == 3
    assert (tree / "a.py").read_text() == MOVING
    assert not target.is_file()
    err = capsys.readouterr().err
    reason = {"under_a_file": f"{tree.parent / 'plain.txt'} is not a folder",
              "missing_folder": f"{tree.parent / 'nowhere'} does not exist",
              "a_folder": "is a folder"}[where]
    assert err == f"mm-schedule-codemod: --json {target}: {reason}\n"


@pytest.mark.parametrize("option, value, what", [
    ("--timeout", "0", "a number of seconds"), ("--timeout", "-1", "a number of seconds"),
    ("--timeout", "nan", "a number of seconds"), ("--timeout", "inf", "a number of seconds"),
    ("--timeout", "soon", "a number of seconds"), ("-j", "0", "a whole number"),
    ("-j", "-2", "a whole number"), ("-j", "1.5", "a whole number"),
])
def test_a_timeout_or_job_count_that_is_not_a_positive_number_is_refused(tree, map_file, capsys,
                                                                         option, value, what):
    assert cli.main(["--write", ".", option, value, "--map", str(map_file)]) == 3
    assert (tree / "a.py").read_text() == MOVING
    err = capsys.readouterr().err
    assert f"expected {what} above 0, got {value!r}" in err and "Traceback" not in err


def test_a_working_folder_that_was_removed_is_refused(tmp_path, map_file, monkeypatch, capsys):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert cli.main(["--check", str(tmp_path), "--map", str(map_file)]) == 3
    assert capsys.readouterr().err == "mm-schedule-codemod: the current folder no longer exists\n"


def test_a_bad_config_table_is_refused(tree, map_file, capsys):
    (tree / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nexclud = ["x"]\n')
    assert cli.main(["--write", ".", "--map", str(map_file)]) == 3
    assert (tree / "a.py").read_text() == MOVING
    assert "unknown key(s) in [tool.mm-schedule-codemod]: ['exclud']" in capsys.readouterr().err


def test_bad_options_exit_3(tree, capsys):
    assert cli.main(["--write", "--check", "."]) == 3
    assert cli.main([]) == 3
    assert (tree / "a.py").read_text() == MOVING


def test_json_dash_is_pure_json_on_stdout_and_text_goes_to_stderr(tree, map_file, capfd):
    (tree / "t.py").write_text(MANUAL)
    (tree / "broken.py").write_text("from sglang.srt.managers.mm_utils import (\n")
    # in this process; capfd reads file descriptors 1 and 2, which the workers share
    assert cli.main([".", "nope.py", "-v", "--json", "-", "--map", str(map_file), "-j", "2"]) == 2
    out, err = capfd.readouterr()
    doc = json.loads(out)  # nothing else on stdout
    assert doc["mode"] == "check"
    assert {f["path"] for f in doc["failed_files"]} == {"nope.py", "broken.py"}
    assert "a.py:1:42: MMS001 [fixable]" in err and "t.py:1:" in err
    assert "nope.py: MMS901 [error] no such file or folder" in err


def test_check_says_fixable_and_only_write_says_fixed(tree, map_file, capsys):
    report = tree.parent / "r.json"
    assert cli.main([".", "--map", str(map_file), "--json", str(report)]) == 1
    out, err = capsys.readouterr()
    assert "[fixable]" in out and "[fixed]" not in out
    assert "1 would change" in err and "1 fixable" in err
    doc = json.loads(report.read_text())
    assert doc["changed_files"] == [] and doc["would_change_files"] == ["a.py"]
    assert [f["status"] for f in doc["findings"]] == ["fixable"]

    assert cli.main([".", "--write", "--map", str(map_file), "--json", str(report)]) == 0
    out, err = capsys.readouterr()
    assert "[fixed]" in out and "1 changed" in err
    doc = json.loads(report.read_text())
    assert doc["changed_files"] == ["a.py"] and doc["summary"]["fixed"] == 1
    assert [f["status"] for f in doc["findings"]] == ["fixed"]


def test_a_tree_with_the_old_modules_own_file_is_warned_about_first(tree, map_file, capsys):
    own = tree / "sglang" / "srt" / "managers"
    own.mkdir(parents=True)
    (own / "mm_utils.py").write_text("def get_embedding_chunk():\n    pass\n")
    report = tree.parent / "r.json"
    assert cli.main(["--write", ".", "--map", str(map_file), "--json", str(report)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("warning: sglang/srt/managers/mm_utils.py: this tree has its own")
    doc = json.loads(report.read_text())
    assert [(f["path"], f["code"], f["status"]) for f in doc["findings"]] == [
        ("a.py", "MMS001", "fixed"), ("sglang/srt/managers/mm_utils.py", "MMS015", "manual")]


def test_json_on_stdout_and_a_diff_together_are_refused(tree, map_file, capsys):
    assert cli.main(["--diff", ".", "--json", "-", "--map", str(map_file)]) == 3
    assert "--json - and --diff both write to stdout" in capsys.readouterr().err


def test_names_the_old_module_lost_in_any_release_are_reported_by_default(tmp_path, monkeypatch,
                                                                         capsys):
    """Gone from mm_utils since 0.5.5.post1 (renamed to init_mm_embedding_cache): an
    ImportError on every later release, so reported without asking, naming the last
    release that had it; aimed at a release that still has it, the use is fine."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.py").write_text("from sglang.srt.managers.mm_utils import init_embedding_cache\n")
    assert cli.main(["old.py"]) == 1
    out = capsys.readouterr().out
    assert ("old.py:1:42: MMS009 [manual] 'init_embedding_cache' is gone from "
            "sglang.srt.managers.mm_utils: last in sglang 0.5.5 (gone since 0.5.5.post1)") in out
    for release in ("0.4.6.post5", "0.5.5"):
        assert cli.main(["old.py", "--target-version", release]) == 0, release
        assert "MMS009" not in capsys.readouterr().out
    assert cli.main(["old.py", "--target-version", "0.5.5.post1"]) == 1
    assert "last in sglang 0.5.5" in capsys.readouterr().out


def test_target_version_accepts_every_release_the_map_covers(tmp_path, monkeypatch, capsys):
    from mm_schedule.codemods.movemap.schema import load_map

    releases = load_map().releases
    assert releases[0] == "0.4.4.post2" and "0.5.17" in releases and "0.5.23" in releases
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("from sglang.srt.managers.mm_utils import get_embedding_chunk\n")
    # moved in the split (0.5.18): rewritten when aiming at or after it, left alone before
    assert cli.main(["a.py", "--target-version", "0.5.18"]) == 1
    assert "MMS001" in capsys.readouterr().out
    assert cli.main(["a.py", "--target-version", "0.5.17"]) == 0
    assert capsys.readouterr().out == ""
    assert cli.main(["a.py", "--target-version", "0.0.1"]) == 3
    assert "sglang 0.0.1 is not a release this map covers (0.4.4.post2 to" in capsys.readouterr().err


@pytest.mark.parametrize("mode, status", [("--check", 1), ("--diff", 1), ("--write", 0)])
def test_a_reader_that_stops_early_ends_the_output_not_the_run(tree, map_file, mode, status):
    """``mm-schedule-codemod . | head -1``: far more output than a pipe holds, and the
    reader leaves after one line. The run still finishes, writes, and reports on stderr."""
    names = ("get_embedding_and_mask", "init_mm_embedding_cache", "get_embedding_chunk",
             "PerImageRequestInfo", "_get_multimodal_mask", "_adjust_embedding_length")
    many = "".join(f"from sglang.srt.managers.mm_utils import {name}\n" for name in names)
    for i in range(150):  # about 90 kB of findings, more than a pipe and a buffer hold
        (tree / f"m{i:03}.py").write_text(many)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mm_schedule.codemods", mode, ".", "--map", str(map_file)],
        cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == status, err
    assert first.startswith("diff --git a/" if mode == "--diff" else "a.py:1:42: MMS001")
    assert "Traceback" not in err and "Exception ignored" not in err
    done = "151 changed" if mode == "--write" else "151 would change"
    assert err.splitlines()[-1].startswith(f"151 files scanned, {done}, 901 findings")
    assert ("mm_schedule import" in (tree / "m149.py").read_text()) == (mode == "--write")


def test_names_the_terminal_cannot_show_come_out_as_escapes(tree, map_file):
    (tree / "名.py").write_text(MOVING)
    proc = subprocess.run(
        [sys.executable, "-m", "mm_schedule.codemods", "--check", ".", "--map", str(map_file)],
        cwd=tree, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 1, proc.stderr
    assert "\\u540d.py:1:42: MMS001 [fixable]" in proc.stdout and "Traceback" not in proc.stderr
