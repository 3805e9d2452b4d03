"""The pre-commit hooks, run the way pre-commit runs them: the hook's ``entry`` split
into words, then the staged files of its types, in a temporary git repository."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {"python": (".py",), "pyi": (".pyi",), "jupyter": (".ipynb",)}


def _hooks() -> dict[str, dict]:
    return {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def _staged(repo: Path, hook: dict) -> list[str]:
    names = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=repo, check=True,
                           capture_output=True, text=True).stdout.split()
    suffixes = tuple(s for tag in hook["types_or"] for s in SUFFIXES[tag])
    return sorted(n for n in names if n.endswith(suffixes))


def _run(repo: Path, hook: dict) -> subprocess.CompletedProcess:
    words = shlex.split(hook["entry"])
    script = shutil.which(words[0], path=str(Path(sys.executable).parent))
    assert script, f"console script {words[0]} is not installed beside {sys.executable}"
    return subprocess.run([script, *words[1:], *hook.get("args", []), *_staged(repo, hook)],
                          cwd=repo, capture_output=True, text=True, timeout=120)


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "app.py").write_text("from sglang.srt.managers.mm_utils import get_embedding_chunk\n")
    (repo / "fine.py").write_text("import os\n")
    (repo / "notes.txt").write_text("from sglang.srt.managers.mm_utils import get_embedding_chunk\n")
    (repo / "generated_pb2.py").write_text("from sglang.srt.managers.mm_utils import get_embedding_chunk\n")
    (repo / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nextend-exclude = ["*_pb2.py"]\n')
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    return repo


def test_the_hooks_are_a_check_by_default_and_a_write_variant():
    hooks = _hooks()
    assert set(hooks) == {"mm-schedule-codemod", "mm-schedule-codemod-write"}
    for hook in hooks.values():
        assert hook["language"] == "python" and set(hook["types_or"]) <= set(SUFFIXES)
    assert "--check" in hooks["mm-schedule-codemod"]["entry"].split()
    assert "--write" in hooks["mm-schedule-codemod-write"]["entry"].split()


def test_the_check_hook_fails_on_a_staged_use_and_changes_nothing(repo):
    before = (repo / "app.py").read_bytes()
    done = _run(repo, _hooks()["mm-schedule-codemod"])
    assert done.returncode == 1, done.stderr
    assert "app.py:1:42: MMS001 [fixable]" in done.stdout
    assert "generated_pb2.py" not in done.stdout  # excluded by the project's settings
    assert (repo / "app.py").read_bytes() == before


def test_the_write_hook_fixes_the_staged_files_then_the_check_passes(repo):
    hooks = _hooks()
    done = _run(repo, hooks["mm-schedule-codemod-write"])
    assert done.returncode == 0, done.stderr
    assert (repo / "app.py").read_text() == "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n"
    assert "mm_utils" in (repo / "notes.txt").read_text()  # not a Python file: not passed
    assert "mm_utils" in (repo / "generated_pb2.py").read_text()
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    assert _run(repo, hooks["mm-schedule-codemod"]).returncode == 0


def test_the_write_hook_on_a_staged_file_of_a_pre_split_fork_warns(tmp_path):
    """pre-commit passes only the staged files: the hook must still find the fork's own
    mm_utils (SGLang's layout, ``python/sglang/...`` under the repository root), warn
    (MMS015) and fail the commit, and not call the names that copy defines gone."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "fork"
    managers = repo / "python" / "sglang" / "srt" / "managers"
    managers.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "python" / "sglang" / "__init__.py").write_text("")
    (managers / "mm_utils.py").write_text(
        "def get_embedding_chunk():\n    pass\n\n\ndef init_embedding_cache(size):\n    pass\n")
    staged = managers / "scheduler.py"
    staged.write_text("from sglang.srt.managers.mm_utils import get_embedding_chunk, "
                      "init_embedding_cache\n")
    subprocess.run(["git", "add", str(staged)], cwd=repo, check=True)
    done = _run(repo, _hooks()["mm-schedule-codemod-write"])
    assert done.returncode == 1, done.stderr
    assert "warning: python/sglang/srt/managers/mm_utils.py: this tree has its own" in done.stderr
    assert "MMS015" in done.stdout and "MMS009" not in done.stdout
    assert "mm_schedule import get_embedding_chunk\n" in staged.read_text()  # as a whole-tree run
