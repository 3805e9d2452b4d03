"""Which files a run looks at: .gitignore (inside a repository; nested, negated,
info/exclude), .ignore files, virtual
environments, excludes from the command line and pyproject.toml, explicit paths,
missing paths, symlink loops, unreadable folders, undecodable names."""

from __future__ import annotations

import json
import os

import pytest

MOVING = "from sglang.srt.managers.mm_utils import get_embedding_chunk, hash_feature\n"
MOVED = (
    "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n"
    "from sglang.srt.managers.mm_utils import hash_feature\n"
)


def _put(root, *paths):
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(MOVING)


def _migrated(root, *paths):
    return {p: (root / p).read_text() == MOVED for p in paths}


def test_nested_gitignores_negations_and_info_exclude(tree, map_file, capsys, cli_main):
    (tree / ".git" / "info").mkdir(parents=True)
    (tree / ".git" / "info" / "exclude").write_text("secret/\n")
    (tree / ".gitignore").write_text("*.gen.py\n/top_only.py\nlogs/\n")
    (tree / "sub" / "deeper").mkdir(parents=True)
    (tree / "sub" / ".gitignore").write_text("!keep.gen.py\nlocal.py\n")
    files = ["a.gen.py", "top_only.py", "logs/x.py", "secret/x.py", "sub/keep.gen.py",
             "sub/drop.gen.py", "sub/top_only.py", "sub/local.py", "sub/deeper/local.py",
             "plain.py"]
    _put(tree, *files)
    assert cli_main("--write", "-v", ".", map_file=map_file) == 0
    assert _migrated(tree, *files) == {
        "a.gen.py": False, "top_only.py": False, "logs/x.py": False, "secret/x.py": False,
        "sub/keep.gen.py": True, "sub/drop.gen.py": False, "sub/top_only.py": True,
        "sub/local.py": False, "sub/deeper/local.py": False, "plain.py": True,
    }
    err = capsys.readouterr().err
    assert f"\nsecret: skipped, ignored by {tree / '.git' / 'info' / 'exclude'}\n" in err
    assert f"\nsub/local.py: skipped, ignored by {tree / 'sub' / '.gitignore'}\n" in err
    assert ".git: skipped, tool or cache folder\n" in err


def test_virtual_environments_are_recognised_by_pyvenv_cfg_not_by_name(tree, map_file, capsys, cli_main):
    _put(tree, "env/__init__.py", "build/x.py", "venv/x.py", "dist/x.py", "anything/x.py",
         "conda/x.py", "node_modules/x.py")
    (tree / "anything" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tree / "conda" / "conda-meta").mkdir()
    assert cli_main("--write", "-v", ".", map_file=map_file) == 0
    assert _migrated(tree, "env/__init__.py", "build/x.py", "venv/x.py", "dist/x.py",
                     "anything/x.py", "conda/x.py", "node_modules/x.py") == {
        "env/__init__.py": True, "build/x.py": True, "venv/x.py": True, "dist/x.py": True,
        "anything/x.py": False, "conda/x.py": False, "node_modules/x.py": False,
    }
    err = capsys.readouterr().err
    assert "anything: skipped, virtual environment\n" in err.splitlines(keepends=True)
    report = tree.parent / "r.json"
    assert cli_main(".", "--json", report, map_file=map_file) == 0  # without -v too
    skipped = json.loads(report.read_text())["skipped"]
    assert {"path": "anything", "reason": "virtual environment"} in skipped
    assert {"path": "conda", "reason": "virtual environment"} in skipped


def test_excludes_from_pyproject_and_the_command_line(tree, map_file, capsys, cli_main):
    (tree / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.mm-schedule-codemod]\n'
        'extend-exclude = ["generated", "pkg/legacy/*.py"]\n')
    files = ["generated/x.py", "pkg/legacy/old.py", "pkg/new.py", "pkg/x_pb2.py", "keep.py"]
    _put(tree, *files)
    assert cli_main("--write", "-v", ".", "--extend-exclude", "*_pb2.py", map_file=map_file) == 0
    assert _migrated(tree, *files) == {
        "generated/x.py": False, "pkg/legacy/old.py": False, "pkg/new.py": True,
        "pkg/x_pb2.py": False, "keep.py": True,
    }
    err = capsys.readouterr().err
    assert f".: settings from {tree / 'pyproject.toml'}" in err
    assert "matches exclude pattern 'pkg/legacy/*.py'" in err
    assert "matches exclude pattern '*_pb2.py'" in err


def test_the_config_of_a_path_is_found_upwards_from_it(tree, map_file, cli_main):
    project = tree / "project"
    (project / "src").mkdir(parents=True)
    (tree / "pyproject.toml").write_text('[project]\nname = "outer"\n')  # no table: passed over
    (project / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nexclude = ["skipme"]\n')
    _put(tree, "project/src/skipme/x.py", "project/src/a.py", "project/.tox/x.py")
    assert cli_main("--write", "project/src", map_file=map_file) == 0
    # exclude replaces the built-in list: .tox is no longer skipped by name (but src is
    # what was walked, so it is not reached here).
    assert _migrated(tree, "project/src/skipme/x.py", "project/src/a.py") == {
        "project/src/skipme/x.py": False, "project/src/a.py": True}
    assert cli_main("--write", "project", map_file=map_file) == 0
    assert (tree / "project/.tox/x.py").read_text() == MOVED


def test_explicit_files_are_processed_unless_force_exclude(tree, map_file, cli_main):
    (tree / ".git").mkdir()
    (tree / ".gitignore").write_text("ignored.py\n")
    _put(tree, "ignored.py", "gen/x.py")
    assert cli_main("--write", "ignored.py", "gen/x.py", "--extend-exclude", "gen",
                 "--force-exclude", map_file=map_file) == 0
    assert _migrated(tree, "ignored.py", "gen/x.py") == {"ignored.py": True, "gen/x.py": False}
    assert cli_main("--write", "gen/x.py", "--extend-exclude", "gen", map_file=map_file) == 0
    assert (tree / "gen/x.py").read_text() == MOVED


def test_a_missing_path_is_reported_and_the_rest_still_runs(tree, map_file, capsys, cli_main):
    _put(tree, "a.py")
    assert cli_main("--write", "nope.py", "a.py", map_file=map_file) == 2
    assert (tree / "a.py").read_text() == MOVED
    assert "nope.py: MMS901 [error] no such file or folder" in capsys.readouterr().err


def test_an_empty_path_argument_is_refused(tree, map_file, capsys, cli_main):
    _put(tree, "a.py")
    assert cli_main("--write", "", map_file=map_file) == 3
    assert (tree / "a.py").read_text() == MOVING
    assert "empty path argument" in capsys.readouterr().err


def test_symlink_loops_are_reported_and_the_rest_still_runs(tree, map_file, capsys, cli_main):
    _put(tree, "a.py")
    os.symlink("loop.py", tree / "loop.py")
    assert cli_main("--write", ".", map_file=map_file) == 2
    assert (tree / "a.py").read_text() == MOVED
    assert "loop.py: MMS903 [error] symlink loop: it points to 'loop.py'" in capsys.readouterr().err
    assert cli_main("--check", "loop.py", map_file=map_file) == 2
    assert "loop.py: MMS903 [error] symlink loop" in capsys.readouterr().err


def test_an_unreadable_folder_is_reported_and_the_rest_still_runs(tree, map_file, capsys, cli_main):
    _put(tree, "a.py", "closed/b.py")
    os.chmod(tree / "closed", 0)
    try:
        try:
            os.listdir(tree / "closed")
            pytest.skip("this user reads folders whatever their mode (root)")
        except PermissionError:
            pass
        assert cli_main("--write", ".", map_file=map_file) == 2
    finally:
        os.chmod(tree / "closed", 0o755)
    assert (tree / "a.py").read_text() == MOVED
    assert "closed: MMS904 [error] cannot read folder: Permission denied" in capsys.readouterr().err


def test_a_nested_project_uses_its_own_table_below_it(tree, map_file, cli_main):
    (tree / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nextend-exclude = ["old"]\n')
    (tree / "sub").mkdir()
    (tree / "sub" / "pyproject.toml").write_text(
        '[tool.mm-schedule-codemod]\nextend-exclude = ["fixtures/*.py"]\n')
    files = ["old/x.py", "fixtures/x.py", "sub/old/x.py", "sub/fixtures/x.py", "sub/fixtures/y/z.py"]
    _put(tree, *files)
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert _migrated(tree, *files) == {
        "old/x.py": False, "fixtures/x.py": True,  # the outer table
        "sub/old/x.py": True, "sub/fixtures/x.py": False, "sub/fixtures/y/z.py": True,  # the inner
    }


def test_the_users_global_git_excludes_file_is_honoured(tree, map_file, monkeypatch, capsys, cli_main):
    home = tree.parent / "home"
    home.mkdir()
    (home / "global-ignore").write_text("scratch_*.py\n")
    (home / ".gitconfig").write_text('[user]\n\tname = x\n[core]\n\texcludesFile = "~/global-ignore"\n')
    monkeypatch.setenv("HOME", str(home))
    (tree / ".git").mkdir()
    (tree / ".gitignore").write_text("!scratch_keep.py\n")  # a repository rule wins
    _put(tree, "scratch_a.py", "scratch_keep.py", "main.py")
    assert cli_main("--write", "-v", ".", map_file=map_file) == 0
    assert _migrated(tree, "scratch_a.py", "scratch_keep.py", "main.py") == {
        "scratch_a.py": False, "scratch_keep.py": True, "main.py": True}
    assert f"scratch_a.py: skipped, ignored by {home / 'global-ignore'}" in capsys.readouterr().err


def test_gitignore_and_ignore_files_can_be_turned_off(tree, map_file, cli_main):
    (tree / ".git").mkdir()
    (tree / ".gitignore").write_text("ignored.py\n")
    (tree / ".ignore").write_text("hidden.py\n")
    _put(tree, "ignored.py", "hidden.py")
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert _migrated(tree, "ignored.py", "hidden.py") == {"ignored.py": False, "hidden.py": False}
    assert cli_main("--write", ".", "--no-respect-gitignore", map_file=map_file) == 0
    assert _migrated(tree, "ignored.py", "hidden.py") == {"ignored.py": True, "hidden.py": True}


def test_gitignore_applies_only_inside_a_git_repository(tree, map_file, capsys, cli_main):
    """As git and ruff read it: outside a repository a ``.gitignore`` is an ordinary file."""
    (tree / ".gitignore").write_text("ignored.py\n")
    (tree / "repo").mkdir()
    (tree / "repo" / ".git").mkdir()  # a repository below the folder walked starts there
    (tree / "repo" / ".gitignore").write_text("ignored.py\n")
    _put(tree, "ignored.py", "repo/ignored.py", "repo/kept.py")
    assert cli_main("--write", "-v", ".", map_file=map_file) == 0
    assert _migrated(tree, "ignored.py", "repo/ignored.py", "repo/kept.py") == {
        "ignored.py": True, "repo/ignored.py": False, "repo/kept.py": True}
    assert f"repo/ignored.py: skipped, ignored by {tree / 'repo' / '.gitignore'}" in capsys.readouterr().err


def test_ignore_files_are_read_everywhere_and_win_over_gitignore(tree, map_file, capsys, cli_main):
    """``.ignore`` (ripgrep's and ruff's): read outside a repository too, including in
    the folders above the one walked, and its rules win over ``.gitignore``'s."""
    (tree / ".ignore").write_text("scratch_*.py\n")
    (tree / "project" / "sub").mkdir(parents=True)
    (tree / "project" / "sub" / ".ignore").write_text("!scratch_keep.py\nlocal.py\n")
    _put(tree, "project/scratch_a.py", "project/sub/scratch_keep.py", "project/sub/local.py",
         "project/main.py")
    assert cli_main("--write", "-v", "project", map_file=map_file) == 0
    assert _migrated(tree, "project/scratch_a.py", "project/sub/scratch_keep.py",
                     "project/sub/local.py", "project/main.py") == {
        "project/scratch_a.py": False, "project/sub/scratch_keep.py": True,
        "project/sub/local.py": False, "project/main.py": True}
    assert f"project/scratch_a.py: skipped, ignored by {tree / '.ignore'}" in capsys.readouterr().err
    (tree / ".git").mkdir()
    (tree / ".gitignore").write_text("!scratch_b.py\nmain.py\n")
    (tree / "project" / ".ignore").write_text("!main.py\n")
    _put(tree, "project/scratch_b.py", "project/main.py")
    assert cli_main("--write", "project", map_file=map_file) == 0
    # .gitignore cannot re-include what .ignore leaves out; .ignore can re-include
    assert _migrated(tree, "project/scratch_b.py", "project/main.py") == {
        "project/scratch_b.py": False, "project/main.py": True}


@pytest.mark.parametrize("xdg", [False, True], ids=["home-config", "xdg-config-home"])
def test_gits_default_global_excludes_file_is_honoured(tree, map_file, monkeypatch, cli_main, xdg):
    """Without ``core.excludesFile``, git reads ``$XDG_CONFIG_HOME/git/ignore``, or
    ``~/.config/git/ignore`` when that variable is unset or empty."""
    home = tree.parent / "home"
    config = tree.parent / "xdg" if xdg else home / ".config"
    (config / "git").mkdir(parents=True)
    home.mkdir(exist_ok=True)
    (config / "git" / "ignore").write_text("scratch_*.py\n")
    (home / ".gitconfig").write_text("[user]\n\tname = x\n")  # no excludesFile
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config) if xdg else "")
    (tree / ".git").mkdir()
    _put(tree, "scratch_a.py", "main.py")
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert _migrated(tree, "scratch_a.py", "main.py") == {"scratch_a.py": False, "main.py": True}


def test_gitignore_escaped_spaces_are_part_of_the_name(tree, map_file, capsys, cli_main):
    (tree / ".git").mkdir()
    (tree / ".gitignore").write_text("foo\\ bar.py\ntrail\\ \nplain.py   \n")
    for name in ("foo bar.py", "trail ", "plain.py", "foo\\ bar.py", "kept.py"):
        (tree / name).write_text(MOVING)
    assert cli_main(".", "-v", map_file=map_file) == 1
    captured = capsys.readouterr()
    assert "foo bar.py: skipped, ignored by" in captured.err
    assert "plain.py: skipped, ignored by" in captured.err  # unescaped trailing spaces dropped
    flagged = {line.split(":")[0] for line in captured.out.splitlines()}
    assert flagged == {"foo\\ bar.py", "kept.py"}  # the backslash is no part of the pattern's name
