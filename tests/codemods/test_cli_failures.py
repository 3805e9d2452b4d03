"""Paths that cannot be processed: each is found while the tree is walked (before any
file is written), reported with its MMS9xx code in text and JSON, never as a
traceback, and every other file is still migrated (exit 2)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from mm_schedule.codemods import pipeline
from mm_schedule.codemods.cli import entry as cli_entry
from mm_schedule.codemods.report import exit_status
from mm_schedule.codemods.report.failures import FAILURES

MOVING = "from sglang.srt.managers.mm_utils import get_embedding_chunk\n"
MOVED = "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "codemod.md"


def _self_link(tree, monkeypatch):
    os.symlink("self.py", tree / "self.py")
    return [], [("self.py", "MMS903", "symlink loop: it points to 'self.py', and following "
                                      "the links never reaches a file")]


def _two_link_loop(tree, monkeypatch):
    os.symlink("l2.py", tree / "l1.py")
    os.symlink("l1.py", tree / "l2.py")
    return [], [("l1.py", "MMS903", "symlink loop: it points to 'l2.py'"),
                ("l2.py", "MMS903", "symlink loop: it points to 'l1.py'")]


def _broken_link(tree, monkeypatch):
    os.symlink("gone.py", tree / "broken.py")
    return [], [("broken.py", "MMS902", "broken symlink: it points to 'gone.py', which does "
                                        "not exist")]


def _link_chain(tree, monkeypatch):
    os.symlink("c2.py", tree / "c1.py")
    os.symlink("gone.py", tree / "c2.py")
    return ["c1.py"], [  # named too: reported once
        ("c1.py", "MMS902", "broken symlink: it points to 'c2.py', a link that leads to "
                            "'gone.py', which does not exist"),
        ("c2.py", "MMS902", "broken symlink: it points to 'gone.py', which does not exist")]


def _loop_on_the_way(tree, monkeypatch):
    os.symlink("loop", tree / "loop")
    return ["loop/x.py"], [("loop/x.py", "MMS903", "symlink loop: following the links never "
                                                   "reaches a file")]


def _missing_argument(tree, monkeypatch):
    return ["nope.py", "sub/nope.py"], [("nope.py", "MMS901", "no such file or folder"),
                                        ("sub/nope.py", "MMS901", "no such file or folder")]


def _unlistable_folder(tree, monkeypatch):
    """A folder whose listing fails (mode 0 for anyone but root)."""
    from mm_schedule.codemods.workspace import discovery

    (tree / "closed").mkdir()
    (tree / "closed" / "b.py").write_text(MOVING)
    real_scandir = os.scandir

    def scandir(path):
        if os.path.basename(path) == "closed":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(discovery.os, "scandir", scandir)
    return [], [("closed", "MMS904", "cannot read folder: Permission denied")]


def _unsearchable_folder(tree, monkeypatch):
    """A folder that can be listed but not searched (mode r--): its names are known, but
    nothing in it can be looked at. Done with the real mode where this user is bound by
    it, else by failing every stat below the folder, as the system would."""
    closed = tree / "closed"
    (closed / "inner").mkdir(parents=True)
    (closed / "b.py").write_text(MOVING)
    closed.chmod(0o644)  # the test puts 0o755 back
    try:
        os.stat(closed / "b.py")
    except PermissionError:
        pass
    else:
        closed.chmod(0o755)
        for name in ("stat", "lstat"):
            real = getattr(os, name)

            def denied(path, *args, real=real, **kwargs):
                folder = os.path.dirname(os.fsdecode(path)) if not isinstance(path, int) else ""
                if os.path.basename(folder) == "closed":
                    raise PermissionError(13, "Permission denied", os.fsdecode(path))
                return real(path, *args, **kwargs)

            monkeypatch.setattr(os, name, denied)
    return [], [("closed", "MMS904", "cannot read folder: Permission denied")]


def _unreadable_file(tree, monkeypatch):
    (tree / "locked.py").write_text(MOVING)
    real = pipeline.read_snapshot

    def read_snapshot(path):
        if path.name == "locked.py":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(pipeline, "read_snapshot", read_snapshot)
    return [], [("locked.py", "MMS904", "cannot read: Permission denied")]


def _undecodable_name(tree, monkeypatch):
    fd = os.open(os.fsencode(tree) + b"/bad\xff.py", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, MOVING.encode())
    os.close(fd)
    return [], [("bad\\udcff.py", "MMS905", "file name is not valid UTF-8; not processed")]


SCENARIOS = [_self_link, _two_link_loop, _broken_link, _link_chain, _loop_on_the_way,
             _missing_argument, _unlistable_folder,
             _unsearchable_folder, _unreadable_file, _undecodable_name]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.strip("_"))
def test_a_path_problem_has_its_code_and_the_rest_is_migrated(tree, map_file, monkeypatch,
                                                               capsys, cli_main, scenario):
    (tree / "a.py").write_text(MOVING)
    (tree / "sub").mkdir()
    (tree / "sub" / "c.py").write_text(MOVING)
    extra, expected = scenario(tree, monkeypatch)
    report = tree.parent / "r.json"
    try:
        status = cli_main("--write", ".", *extra, "--json", report, map_file=map_file)
    finally:
        if (tree / "closed").exists():
            (tree / "closed").chmod(0o755)
    out, err = capsys.readouterr()
    assert status == 2, err
    assert "Traceback" not in out + err
    assert (tree / "a.py").read_text() == MOVED and (tree / "sub" / "c.py").read_text() == MOVED
    failure_lines = [line for line in err.splitlines() if " [error] " in line]
    assert len(failure_lines) == len(expected), err
    for line, (path, code, message) in zip(failure_lines, expected):
        assert line.startswith(f"{path}: {code} [error] {message}"), line
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert [(f["path"], f["code"]) for f in doc["failed_files"]] == [
        (path, code) for path, code, _ in expected]
    for entry, (_, _, message) in zip(doc["failed_files"], expected):
        assert entry["error"].startswith(message)
    assert doc["summary"]["files_failed"] == len(expected)
    assert sorted(doc["changed_files"]) == ["a.py", "sub/c.py"]
    assert doc["failure_codes"] == {code: {"name": name, "summary": summary}
                                    for code, (name, summary) in FAILURES.items()}


def test_the_tree_is_walked_to_the_end_before_the_first_file_is_written(tree, map_file,
                                                                      monkeypatch, cli_main):
    for name in ("a.py", "b.py", "z.py"):
        (tree / name).write_text(MOVING)
    os.symlink("self.py", tree / "self.py")
    os.symlink("gone.py", tree / "y_broken.py")  # after a.py and b.py in walking order
    events = []
    real_discover, real_replace = pipeline.discover, pipeline.replace

    def discover(*args, **kwargs):
        found = real_discover(*args, **kwargs)
        events.append(("walked", sorted(path for path, _ in found.problems)))
        return found

    def replace(snapshot, data, guard=None):
        events.append(("write", snapshot.path.name))
        return real_replace(snapshot, data, guard)

    monkeypatch.setattr(pipeline, "discover", discover)
    monkeypatch.setattr(pipeline, "replace", replace)
    assert cli_main("--write", ".", map_file=map_file) == 2
    assert events[0] == ("walked", ["self.py", "y_broken.py"])
    assert sorted(events[1:]) == [("write", "a.py"), ("write", "b.py"), ("write", "z.py")]


def test_a_folder_named_on_the_command_line_that_cannot_be_searched(tree, map_file, monkeypatch,
                                                                    capsys, cli_main):
    (tree / "a.py").write_text(MOVING)
    _unsearchable_folder(tree, monkeypatch)
    try:
        assert cli_main("--write", "a.py", "closed", "closed/b.py", map_file=map_file) == 2
    finally:
        (tree / "closed").chmod(0o755)
    err = capsys.readouterr().err
    assert "closed: MMS904 [error] cannot read folder: Permission denied\n" in err
    assert "closed/b.py: MMS904 [error] cannot read: Permission denied\n" in err
    assert "Traceback" not in err and (tree / "a.py").read_text() == MOVED


def test_failure_codes_and_exit_statuses_are_documented():
    docs = DOCS.read_text(encoding="utf-8")
    for code, (name, summary) in FAILURES.items():
        assert f"\n| `{code}` | `{name}` | {summary} |\n" in docs, code
    help_text = cli_entry._parser().format_help()
    assert help_text.rstrip().endswith(exit_status.EXIT_STATUS_HELP.rstrip())
    table = docs[docs.index("## Exit status"):docs.index("## Paths that cannot be processed")]
    for status in (exit_status.EXIT_OK, exit_status.EXIT_REMAINING, exit_status.EXIT_FAILED, exit_status.EXIT_USAGE,
                   exit_status.EXIT_INTERRUPTED, exit_status.EXIT_TERMINATED):
        assert re.search(rf"^\| {status} \|", table, re.M), status
        assert re.search(rf"^  {status} ", exit_status.EXIT_STATUS_HELP, re.M), status


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_are_never_opened_for_reading(tree, map_file):
    """Reading a FIFO waits for a writer forever: a FIFO named on the command line is a
    failure, one reached through a symlink is skipped, and a FIFO where a .gitignore or a
    pyproject.toml would be is passed over. (A subprocess, so that a regression times out
    instead of hanging the test run.)"""
    import subprocess
    import sys

    (tree / "a.py").write_text(MOVING)
    (tree / "sub").mkdir()
    (tree / "sub" / "c.py").write_text(MOVING)
    (tree / ".git").mkdir()
    os.mkfifo(tree / "pipe.py")
    os.mkfifo(tree / "sub" / ".gitignore")
    os.mkfifo(tree / "sub" / ".ignore")
    os.mkfifo(tree / "sub" / "pyproject.toml")
    os.symlink("pipe.py", tree / "link.py")
    report = tree.parent / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mm_schedule.codemods", "--write", ".", "pipe.py", "--json",
         str(report), "--map", str(map_file), "-j", "1"],
        cwd=tree, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "pipe.py: MMS904 [error] cannot read: not a regular file (a FIFO)\n" in proc.stderr
    doc = json.loads(report.read_text())
    assert [(f["path"], f["code"]) for f in doc["failed_files"]] == [("pipe.py", "MMS904")]
    assert {"path": "link.py", "reason": "symlink to a FIFO, not a file"} in doc["skipped"]
    assert sorted(doc["changed_files"]) == ["a.py", "sub/c.py"]


def test_a_tree_nested_deeper_than_the_recursion_limit_is_walked(tree, map_file, capsys, cli_main):
    import sys

    depth = sys.getrecursionlimit() + 200
    fd = os.open(tree, os.O_RDONLY)
    try:
        for _ in range(depth):  # through folder descriptors: no path grows with the depth
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("x.py", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd), "w") as handle:
            handle.write(MOVING)
    finally:
        os.close(fd)
    try:
        assert cli_main("--write", ".", map_file=map_file) == 0
        deepest = tree.joinpath(*["d"] * depth, "x.py")
        assert deepest.read_text() == MOVED
        assert "Traceback" not in capsys.readouterr().err
    finally:
        _remove_chain(tree / "d")


def _remove_chain(top):
    """Remove a chain of nested ``d`` folders level by level (a recursive removal would
    itself exceed the recursion limit): the child moves up and its parent goes."""
    while top.exists():
        for name in os.listdir(top):
            if name != "d":
                os.unlink(top / name)
        if (top / "d").exists():
            os.rename(top / "d", top.parent / "next")
        os.rmdir(top)
        if (top.parent / "next").exists():
            os.rename(top.parent / "next", top)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_passed_over_during_a_walk_is_said_with_verbose(tree, map_file, capsys, cli_main):
    (tree / "sub").mkdir()
    (tree / "sub" / "a.py").write_text(MOVING)
    os.mkfifo(tree / "sub" / "pipe.py")
    assert cli_main("sub", "-v", "--json", str(tree.parent / "r.json"), map_file=map_file) == 1
    assert "sub/pipe.py: skipped, a FIFO, not a regular file (never opened)" in capsys.readouterr().err
    doc = json.loads((tree.parent / "r.json").read_text())
    assert {"path": "sub/pipe.py", "reason": "a FIFO, not a regular file (never opened)"} in doc["skipped"]
