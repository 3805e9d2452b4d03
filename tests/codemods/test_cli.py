"""The command line: modes, exit status, atomic writes, reports, file discovery."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from mm_schedule.codemods import cli, pipeline

MOVING = "from sglang.srt.managers.mm_utils import get_embedding_chunk, hash_feature\n"
MOVED = (
    "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n"
    "from sglang.srt.managers.mm_utils import hash_feature\n"
)
MANUAL = '@patch("sglang.srt.managers.mm_utils.get_embedding_and_mask")\ndef t(m):\n    pass\n'


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "a.py").write_text(MOVING)
    (root / "pkg" / "b.py").write_text("from .mm_utils import _is_hip\n")
    (root / "pkg" / "mm_utils.py").write_text("_is_hip = False\n")  # the project's own
    (root / "clean.py").write_text("import os\n")
    monkeypatch.chdir(root)
    return root


def test_check_writes_nothing_and_exits_1_when_work_remains(project, map_file, capsys, cli_main):
    before = (project / "pkg" / "a.py").read_bytes()
    assert cli_main("--check", ".", map_file=map_file) == 1
    assert (project / "pkg" / "a.py").read_bytes() == before
    out = capsys.readouterr().out
    assert "pkg/a.py:1:" in out and "MMS001" in out
    assert "pkg/b.py" not in out  # relative import of the project's own mm_utils


def test_check_exits_0_on_a_clean_tree(project, map_file, cli_main):
    (project / "pkg" / "a.py").write_text(MOVED)
    assert cli_main("--check", ".", map_file=map_file) == 0


def test_write_applies_keeps_mode_and_a_second_run_is_clean(project, map_file, cli_main):
    target = project / "pkg" / "a.py"
    target.chmod(0o640)
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert target.read_text() == MOVED
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert cli_main("--check", ".", map_file=map_file) == 0
    assert not list(project.rglob("*.mmtmp"))


def test_write_exits_1_while_manual_findings_remain(project, map_file, cli_main):
    (project / "t.py").write_text(MANUAL)
    assert cli_main("--write", ".", map_file=map_file) == 1
    assert (project / "t.py").read_text() == MANUAL


def test_unparsable_file_is_listed_skipped_and_exit_is_2(project, map_file, capsys, cli_main):
    (project / "broken.py").write_text("from sglang.srt.managers.mm_utils import (\n")
    assert cli_main("--write", ".", map_file=map_file) == 2
    assert (project / "pkg" / "a.py").read_text() == MOVED  # the run went on
    err = capsys.readouterr().err
    assert "broken.py: MMS906 [error] cannot parse" in err


def test_interrupt_during_writes_exits_130_with_each_file_old_or_new(project, map_file,
                                                                     monkeypatch, cli_main):
    for i in range(4):
        (project / f"m{i}.py").write_text(MOVING)
    real_rename = os.rename
    calls = []

    def interrupted_on_second(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated Ctrl-C")
        real_rename(*args, **kwargs)

    monkeypatch.setattr(os, "rename", interrupted_on_second)
    assert cli_main("--write", ".", map_file=map_file) == 130
    contents = [p.read_text() for p in [project / "pkg" / "a.py", *project.glob("m*.py")]]
    assert all(c in (MOVING, MOVED) for c in contents)
    assert contents.count(MOVED) == 1
    assert sorted(p.name for p in project.rglob("*")) == sorted(
        ["pkg", "__init__.py", "a.py", "b.py", "mm_utils.py", "clean.py",
         "m0.py", "m1.py", "m2.py", "m3.py"])


def test_diff_is_accepted_by_git_apply(project, map_file, capsys, cli_main):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    (project / "nonl.py").write_text(MOVING.rstrip("\n"))
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    assert cli_main("--diff", ".", map_file=map_file) == 1
    patch = capsys.readouterr().out
    assert patch.startswith("diff --git a/")
    assert (project / "pkg" / "a.py").read_text() == MOVING
    (project / "change.patch").write_text(patch)
    subprocess.run(["git", "apply", "--check", "change.patch"], cwd=project, check=True)
    subprocess.run(["git", "apply", "change.patch"], cwd=project, check=True)
    assert (project / "pkg" / "a.py").read_text() == MOVED


def test_json_report_schema(project, map_file, cli_main):
    (project / "t.py").write_text(MANUAL)
    report = project / "report.json"
    assert cli_main(".", "--json", report, map_file=map_file) == 1
    doc = json.loads(report.read_text())
    assert doc["mode"] == "check" and doc["schema_version"] == 2
    assert set(doc["summary"]) >= {"files_scanned", "files_changed", "files_would_change",
                                   "files_failed", "findings", "fixed", "fixable", "manual",
                                   "prefiltered", "by_code"}
    assert doc["summary"]["files_scanned"] == 6 and doc["summary"]["files_would_change"] == 1
    assert doc["summary"]["files_changed"] == 0 and doc["summary"]["fixed"] == 0
    assert doc["changed_files"] == [] and doc["would_change_files"] == ["pkg/a.py"]
    keys = {"path", "line", "column", "code", "symbol", "message", "fixed", "status"}
    assert all(set(f) == keys for f in doc["findings"])
    by_path = {f["path"]: f for f in doc["findings"]}
    assert by_path["t.py"]["code"] == "MMS005" and by_path["t.py"]["fixed"] is False
    assert by_path["pkg/a.py"]["line"] == 1 and by_path["pkg/a.py"]["status"] == "fixable"
    assert set(doc["rules"]) >= {f["code"] for f in doc["findings"]}


def test_gitignore_and_real_venvs_are_skipped_but_packages_named_env_or_build_are_not(
        project, map_file, cli_main):
    for folder in ("ignored", ".venv", "build", "env", "myenv", "keep"):
        (project / folder).mkdir()
        (project / folder / "x.py").write_text(MOVING)
    (project / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    (project / ".git").mkdir()  # .gitignore is read inside a repository
    (project / ".gitignore").write_text("ignored/\n*.gen.py\n")
    (project / "y.gen.py").write_text(MOVING)
    assert cli_main("--write", ".", map_file=map_file) == 0
    for path in ("keep/x.py", "build/x.py", "env/x.py"):
        assert (project / path).read_text() == MOVED, path
    for path in ("ignored/x.py", ".venv/x.py", "myenv/x.py", "y.gen.py"):
        assert (project / path).read_text() == MOVING, path


def test_process_pool_gives_the_same_result(project, map_file):
    for i in range(12):
        (project / f"m{i}.py").write_text(MOVING)
    assert cli.main([".", "--write", "--map", str(map_file), "-j", "2"]) == 0
    assert all(p.read_text() == MOVED for p in project.glob("m*.py"))


def test_derive_subcommand_is_dispatched(monkeypatch):
    from mm_schedule.codemods.movemap import derive_cli

    seen = []
    monkeypatch.setattr(derive_cli, "main", lambda argv: seen.append(argv) or 7)
    assert cli.main(["derive", "--old", "x.py"]) == 7
    assert seen == [["--old", "x.py"]]


def test_module_entry_point_runs_without_torch(project, map_file):
    code = textwrap.dedent(
        """
        import runpy, sys
        sys.argv = ["mm-schedule-codemod", "--check", ".", "--map", sys.argv[1]]
        try:
            runpy.run_module("mm_schedule.codemods", run_name="__main__")
        except SystemExit as exc:
            assert "torch" not in sys.modules and "triton" not in sys.modules
            raise
        """
    )
    proc = subprocess.run([sys.executable, "-c", code, str(map_file)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "MMS001" in proc.stdout


def test_an_internal_error_on_one_file_does_not_stop_the_run(project, map_file, monkeypatch, capsys, cli_main):
    real = pipeline.migrate_source

    def flaky(source, move_map, *, path, package, gate, **options):
        if path.endswith("a.py"):
            raise RuntimeError("boom")
        return real(source, move_map, path=path, package=package, gate=gate, **options)

    monkeypatch.setattr(pipeline, "migrate_source", flaky)
    (project / "c.py").write_text(MOVING)
    assert cli_main("--write", ".", map_file=map_file) == 2
    assert (project / "c.py").read_text() == MOVED
    assert (project / "pkg" / "a.py").read_text() == MOVING
    assert "pkg/a.py: MMS907 [error] internal error (RuntimeError: boom); file left as is" in capsys.readouterr().err


def test_version_is_the_installed_distributions(capsys):
    from importlib import metadata

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mm-schedule-codemod {metadata.version('mm-schedule')}"
