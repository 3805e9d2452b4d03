"""A file run alone meets the fork check of a run over its whole project: named on the
command line, through the pre-commit hooks (see test_pre_commit_hooks.py), or on stdin
with ``--stdin-filename``. The project root is found above the file, and the fork's
own old module there is read, however deep the file sits."""

from __future__ import annotations

import io
import json
import sys

import pytest

from mm_schedule.codemods import cli
from mm_schedule.codemods.workspace.project import module_files, project_root

OLD_FILE = "python/sglang/srt/managers/mm_utils.py"
# A fork from before the split (like SGLang 0.5.5): its own mm_utils still defines what
# later moved, and init_embedding_cache, which upstream dropped after 0.5.5.
PRE_SPLIT = (
    "embedding_cache = None\n\n\n"
    "def init_embedding_cache(max_size):\n    pass\n\n\n"
    "def get_embedding_chunk(*args):\n    pass\n\n\n"
    "def general_mm_embed_routine(*args):\n    pass\n"
)
SCHEDULER = ("from sglang.srt.managers.mm_utils import get_embedding_chunk, init_embedding_cache\n"
             "init_embedding_cache(10)\n")


@pytest.fixture
def fork(tmp_path, monkeypatch):
    """SGLang's layout: the repository root holds ``python/`` with its pyproject.toml."""
    root = tmp_path / "fork"
    managers = root / "python" / "sglang" / "srt" / "managers"
    managers.mkdir(parents=True)
    (root / "python" / "pyproject.toml").write_text("[project]\nname = 'sglang'\n")
    (root / "python" / "sglang" / "__init__.py").write_text("")
    (root / OLD_FILE).write_text(PRE_SPLIT)
    (managers / "scheduler.py").write_text(SCHEDULER)
    (root / "test").mkdir()
    (root / "test" / "test_embed.py").write_text(
        "from sglang.srt.managers.mm_utils import general_mm_embed_routine\n")
    monkeypatch.chdir(root)
    return root


def _report(tmp_path, *args, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    status = cli.main([*args, "--json", str(report), "-j", "1"])
    return status, json.loads(report.read_text())


def _findings(doc: dict) -> list[tuple[str, str, str]]:
    return sorted((f["path"], f["code"], f["symbol"]) for f in doc["findings"])


def test_the_project_root_is_the_nearest_marker_or_the_packages_top(tmp_path):
    deep = tmp_path / "a" / "pkg" / "sub"
    deep.mkdir(parents=True)
    (tmp_path / "a" / "pkg" / "__init__.py").write_text("")
    (deep / "__init__.py").write_text("")
    assert project_root(deep / "m.py") == tmp_path / "a"  # no marker: above the top package
    (tmp_path / "a" / "pkg" / "setup.cfg").write_text("")
    assert project_root(deep / "m.py") == tmp_path / "a" / "pkg"
    (tmp_path / "x" / ".git").mkdir(parents=True)
    assert project_root(tmp_path / "x" / "y" / "z.py") == tmp_path / "x"


def test_a_modules_own_file_is_looked_for_at_the_root_and_one_folder_below(fork):
    assert module_files(fork, "sglang.srt.managers.mm_utils") == [fork / OLD_FILE]
    assert module_files(fork / "python", "sglang.srt.managers.mm_utils") == [fork / OLD_FILE]
    (fork / "vendor" / "lib").mkdir(parents=True)  # a copy deeper down is not the project's
    (fork / "vendor" / "lib" / "sglang").mkdir()
    assert module_files(fork / "vendor", "sglang.srt.managers.mm_utils") == []


def test_a_file_named_alone_gets_the_findings_of_the_whole_tree_run(fork, tmp_path, capsys):
    whole_status, whole = _report(tmp_path, ".")
    alone_status, alone = _report(tmp_path, "python/sglang/srt/managers/scheduler.py")
    capsys.readouterr()
    expected = [("python/sglang/srt/managers/mm_utils.py", "MMS015", "sglang.srt.managers.mm_utils"),
                ("python/sglang/srt/managers/scheduler.py", "MMS001", "get_embedding_chunk")]
    assert _findings(whole) == expected and whole_status == 1
    assert _findings(alone) == expected and alone_status == 1
    # init_embedding_cache is gone upstream, but this fork's own copy still defines it
    assert all(f["code"] != "MMS009" for f in alone["findings"])


def test_a_file_on_stdin_gets_the_findings_of_the_whole_tree_run(fork, tmp_path, monkeypatch,
                                                                 capsysbinary):
    status, doc = _report(tmp_path, "-", "--write", "--stdin-filename",
                          "python/sglang/srt/managers/scheduler.py",
                          stdin=SCHEDULER.encode(), monkeypatch=monkeypatch)
    out, err = capsysbinary.readouterr()
    assert status == 1
    assert out.startswith(b"from sglang.srt.managers.mm_schedule import get_embedding_chunk\n")
    assert b"warning: python/sglang/srt/managers/mm_utils.py: this tree has its own" in err
    assert _findings(doc) == [
        ("python/sglang/srt/managers/mm_utils.py", "MMS015", "sglang.srt.managers.mm_utils"),
        ("python/sglang/srt/managers/scheduler.py", "MMS001", "get_embedding_chunk")]


def test_the_fork_warning_needs_a_rewrite_or_a_moved_name(fork, tmp_path, capsys):
    """A tree that uses only what its fork's old module keeps (no rewrite, no moved
    name) has nothing to check: no MMS015, and --check passes, whole or per file."""
    (fork / OLD_FILE).with_name("scheduler.py").write_text("import os\n")
    for paths in (["."], ["test/test_embed.py"]):
        status, doc = _report(tmp_path, *paths)
        assert (status, doc["findings"]) == (0, []), paths
    assert "warning" not in capsys.readouterr().err


def test_a_forks_own_new_module_settles_it_for_a_file_run_alone(fork, tmp_path, capsys):
    """After the fork's own split: its mm_schedule.py binds what the rewrite reads there,
    so the file run alone is as green as the whole tree once written."""
    (fork / OLD_FILE).with_name("mm_schedule.py").write_text("def get_embedding_chunk(*args):\n    pass\n")
    alone = ["python/sglang/srt/managers/scheduler.py"]
    status, doc = _report(tmp_path, *alone)
    assert status == 1 and _findings(doc) == [
        ("python/sglang/srt/managers/scheduler.py", "MMS001", "get_embedding_chunk")]
    assert _report(tmp_path, *alone, "--write")[0] == 0
    assert _report(tmp_path, *alone)[1]["findings"] == []
    assert "warning" not in capsys.readouterr().err
