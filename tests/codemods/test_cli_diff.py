"""--diff output applies with ``git apply`` and ``patch -p1`` and gives exactly what
--write gives, for files whose bytes trip line-based tools."""

from __future__ import annotations

import shutil
import subprocess

import pytest

IMPORT = b"from sglang.srt.managers.mm_utils import get_embedding_chunk, hash_feature"
FILES = {
    "bom.py": b"\xef\xbb\xbf" + IMPORT + b"\nx = 1\n",
    "latin1.py": b"# -*- coding: latin-1 -*-\n" + IMPORT + b"\ns = 'caf\xe9'\n",
    "formfeed.py": b"x = 1\n\x0c\n" + IMPORT + b"\n\x0cy = 2\n",
    "u2028.py": b"s = 'a\xe2\x80\xa8b'\n" + IMPORT + b"\nt = 'c\xe2\x80\xa9d'\n",
    "lone_cr.py": b"x = 1\r" + IMPORT + b"\ry = 2\r",
    "crlf.py": b"x = 1\r\n" + IMPORT + b"\r\ny = 2\r\n",
    "no_newline.py": b"x = 1\n" + IMPORT,
    "dir with space/caf\xc3\xa9 name.py": IMPORT + b"\n",
}


def _tree(root):
    root.mkdir()
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def _snapshot(root):
    return {name: (root / name).read_bytes() for name in FILES}


def _codemod(codemod_in, root, map_file, *args):
    return codemod_in(root, ".", *args, "--map", map_file)


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("patch") is None,
                    reason="needs git and patch")
def test_the_diff_applies_with_git_and_patch_and_equals_write(tmp_path, map_file, codemod_in):
    written = _tree(tmp_path / "written")
    proc = _codemod(codemod_in, written, map_file, "--write")
    assert proc.returncode == 0, proc.stderr.decode()
    expected = _snapshot(written)
    assert all(expected[name] != data for name, data in FILES.items()), "every file must change"

    shown = _tree(tmp_path / "shown")
    proc = _codemod(codemod_in, shown, map_file, "--diff")
    assert proc.returncode == 1, proc.stderr.decode()
    patch = proc.stdout
    assert _snapshot(shown) == FILES  # --diff writes nothing
    assert patch.count(b"diff --git ") == len(FILES)

    with_git = _tree(tmp_path / "with_git")
    subprocess.run(["git", "apply", "--check", "-"], cwd=with_git, input=patch, check=True)
    subprocess.run(["git", "apply", "-"], cwd=with_git, input=patch, check=True)
    assert _snapshot(with_git) == expected

    with_patch = _tree(tmp_path / "with_patch")
    subprocess.run(["patch", "-p1", "--quiet", "--no-backup-if-mismatch"], cwd=with_patch,
                   input=patch, check=True)
    assert _snapshot(with_patch) == expected


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("patch") is None,
                    reason="needs git and patch")
def test_a_file_outside_the_working_folder_is_named_as_git_names_it(tmp_path, map_file, codemod_in):
    """Neither tool takes ``..`` or an absolute path from a patch: the absolute path loses
    its leading slash (as in ``git diff --no-index``) and the patch applies from ``/``."""
    outside = tmp_path / "outside" / "x.py"
    outside.parent.mkdir()
    outside.write_bytes(FILES["crlf.py"])
    here = tmp_path / "here"
    here.mkdir()
    proc = codemod_in(here, "--diff", "../outside/x.py", "--map", map_file)
    assert proc.returncode == 1, proc.stderr.decode()
    name = outside.as_posix().lstrip("/").encode()
    assert proc.stdout.startswith(b"diff --git a/" + name + b" b/" + name + b"\n")
    assert b"\n--- a/" + name + b"\n+++ b/" + name + b"\n" in proc.stdout
    subprocess.run(["patch", "-p1", "--dry-run", "--quiet", "-d", "/"], input=proc.stdout,
                   check=True, capture_output=True)
    subprocess.run(["git", "apply", "-"], cwd="/", input=proc.stdout, check=True)
    twin = here / "twin.py"
    twin.write_bytes(FILES["crlf.py"])
    assert codemod_in(here, "--write", "twin.py", "--map", map_file).returncode == 0
    assert outside.read_bytes() == twin.read_bytes() != FILES["crlf.py"]


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("patch") is None,
                    reason="needs git and patch")
def test_run_in_a_subfolder_of_a_repository_the_patch_names_paths_from_its_top(tmp_path,
                                                                               map_file, codemod_in):
    """``git apply`` in a subfolder of a repository reads paths from the repository's top
    and silently skips the others: named from the working folder, the patch would do
    nothing there and still exit 0."""
    repo = tmp_path / "repo"
    _tree(repo)
    sub = repo / "pkg"
    sub.mkdir()
    original = FILES["crlf.py"]
    (sub / "x.py").write_bytes(original)
    proc = codemod_in(sub, "--diff", ".", "--map", map_file)
    assert proc.returncode == 1, proc.stderr.decode()
    assert proc.stdout.startswith(b"diff --git a/pkg/x.py b/pkg/x.py\n")
    assert proc.stderr.startswith(b"x.py:2:42: MMS001")  # the report: from the working folder
    subprocess.run(["git", "apply", "-"], cwd=sub, input=proc.stdout, check=True)
    changed = (sub / "x.py").read_bytes()
    assert changed != original
    (sub / "x.py").write_bytes(original)
    subprocess.run(["patch", "-p1", "--quiet"], cwd=repo, input=proc.stdout, check=True)
    assert (sub / "x.py").read_bytes() == changed
