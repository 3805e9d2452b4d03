"""MMS015 settles: a fork whose own new module binds every rewrite target, or that
acknowledges the warning, can go green in CI."""

from __future__ import annotations

import json

import pytest

from mm_schedule.codemods import cli

USE = "from sglang.srt.managers.mm_utils import get_embedding_chunk, _is_hip\n"


@pytest.fixture
def fork(tree):
    managers = tree / "sglang" / "srt" / "managers"
    managers.mkdir(parents=True)
    (managers / "mm_utils.py").write_text("def get_embedding_chunk():\n    pass\n_is_hip = False\n")
    (tree / "app.py").write_text(USE)
    return managers


def _run(tree, map_file, *args):
    report = tree.parent / "r.json"
    status = cli.main([".", *args, "--map", str(map_file), "--json", str(report), "-j", "1"])
    doc = json.loads(report.read_text())
    return status, [(f["path"], f["code"]) for f in doc["findings"]], doc


def test_a_fork_without_its_own_new_module_is_warned_about(tree, fork, map_file, capsys):
    status, findings, _ = _run(tree, map_file, "--write")
    assert status == 1 and ("sglang/srt/managers/mm_utils.py", "MMS015") in findings
    assert "warning: sglang/srt/managers/mm_utils.py: this tree has its own" in capsys.readouterr().err


def test_its_own_new_module_binding_every_target_settles_it(tree, fork, map_file, capsys):
    (fork / "mm_schedule.py").write_text(
        "import os as _is_hip\n\n\ndef get_embedding_chunk():\n    pass\n")  # imports bind too
    status, findings, _ = _run(tree, map_file, "--check")
    assert status == 1 and findings == [("app.py", "MMS001"), ("app.py", "MMS002")]  # the rewrites
    assert "warning" not in capsys.readouterr().err
    status, findings, _ = _run(tree, map_file, "--write")
    assert status == 0 and "MMS015" not in [c for _, c in findings]
    assert _run(tree, map_file, "--check")[:2] == (0, [])  # green from now on


def test_its_own_new_module_missing_a_target_names_it(tree, fork, map_file, capsys):
    (fork / "mm_schedule.py").write_text("def get_embedding_chunk():\n    pass\n")
    status, findings, doc = _run(tree, map_file, "--write")
    assert status == 1 and ("sglang/srt/managers/mm_utils.py", "MMS015") in findings
    message = next(f["message"] for f in doc["findings"] if f["code"] == "MMS015")
    assert "sglang/srt/managers/mm_schedule.py does not bind _is_hip," in message
    (fork / "mm_schedule.py").write_text("def get_embedding_chunk(:\n")
    (tree / "app.py").write_text(USE)
    _, _, doc = _run(tree, map_file, "--check")
    assert "mm_schedule.py cannot be parsed" in next(
        f["message"] for f in doc["findings"] if f["code"] == "MMS015")


def test_a_suppression_in_the_forks_old_module_acknowledges_it(tree, fork, map_file):
    old = fork / "mm_utils.py"
    old.write_text("# mm-schedule-codemod: ignore[MMS015]\n" + old.read_text())
    status, findings, _ = _run(tree, map_file, "--write", "--report-unused-suppressions")
    assert status == 0 and findings == [("app.py", "MMS001"), ("app.py", "MMS002")]


def test_a_bare_suppression_in_the_forks_old_module_does_not(tree, fork, map_file):
    old = fork / "mm_utils.py"
    old.write_text("x = 1  # mm-schedule-codemod: ignore\n" + old.read_text())
    assert ("sglang/srt/managers/mm_utils.py", "MMS015") in _run(tree, map_file, "--write")[1]


def test_the_config_key_acknowledges_it(tree, fork, map_file):
    (tree / "pyproject.toml").write_text("[tool.mm-schedule-codemod]\nacknowledge-fork = true\n")
    status, findings, _ = _run(tree, map_file, "--write")
    assert status == 0 and "MMS015" not in [c for _, c in findings]
    (tree / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nacknowledge-fork = "yes"\n')
    assert cli.main([".", "--map", str(map_file)]) == 3
