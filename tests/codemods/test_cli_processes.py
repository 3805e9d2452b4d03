"""The command as a user runs it, in a subprocess: a file that crashes or exhausts
libcst's parser, Ctrl-C, SIGTERM and SIGKILL in the middle of --write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

IMPORT = "from sglang.srt.managers.mm_utils import get_embedding_chunk, hash_feature\n"
MOVED = (
    "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n"
    "from sglang.srt.managers.mm_utils import hash_feature\n"
)
# libcst 1.9's native parser segfaults on this; CPython's ast refuses it (too deep), so
# the cheap gate lets it through to libcst.
SEGFAULTS = IMPORT + "y = " + "(" * 5000 + "1" + ")" * 5000 + "\n"
# ... and exceeds Python's recursion limit on this one.
RECURSES = IMPORT + "y = " + " + ".join(f"'s{i}'" for i in range(500)) + "\n"


def _command(map_file, *args):
    return [sys.executable, "-m", "mm_schedule.codemods", *args, "--map", str(map_file)]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    return root


@pytest.mark.parametrize("jobs", [[], ["-j", "1"], ["-j", "2"]], ids=["default", "j1", "j2"])
def test_a_file_that_crashes_the_parser_fails_alone(tree, map_file, jobs):
    (tree / "deep.py").write_text(SEGFAULTS)
    (tree / "long.py").write_text(RECURSES)
    for i in range(6):
        (tree / f"ok{i}.py").write_text(IMPORT)
    proc = subprocess.run(_command(map_file, "--write", ".", *jobs), cwd=tree,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert all((tree / f"ok{i}.py").read_text() == MOVED for i in range(6))
    assert (tree / "deep.py").read_text() == SEGFAULTS
    assert (tree / "long.py").read_text() == RECURSES
    assert "deep.py: MMS907 [error] crashed the parser (worker killed by SIGSEGV); file left as is" in proc.stderr
    assert "long.py: MMS907 [error] too deeply nested for the parser" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "6 changed" in proc.stderr and "2 failed" in proc.stderr


def _start_big_run(tree, map_file, count, *args, link_into=None):
    for i in range(count):
        (tree / f"m{i:03d}.py").write_text(IMPORT + f"X{i} = {i}\n" * 40)
    if link_into is not None:
        link_into.mkdir()
        for i in range(count):
            os.link(tree / f"m{i:03d}.py", link_into / f"m{i:03d}.py")
    proc = subprocess.Popen(_command(map_file, "--write", ".", *args), cwd=tree,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    # Wait until the run is writing: two migrated files appear (so that one write has
    # certainly ended; a write caught before its end is undone, which is right too).
    # Sizes tell a migrated file without reading it, and the files are written roughly in
    # name order, so a look usually stops after the first few: a slow look would let a
    # fast run end before the caller's signal reaches it.
    migrated_size = [len(MOVED) + len(f"X{i} = {i}\n") * 40 for i in range(count)]
    deadline = time.monotonic() + 60
    while not _written_at_least(tree, migrated_size, 2):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the run never wrote a file"
        time.sleep(0.001)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    return proc


def _written_at_least(tree, migrated_size, wanted):
    found = 0
    for i, size in enumerate(migrated_size):
        try:
            found += os.stat(tree / f"m{i:03d}.py").st_size == size
        except FileNotFoundError:  # between a rename's unlink and link
            continue
        if found >= wanted:
            return True
    return False


def _states(tree, count):
    """How many files are old, how many new; fails on anything else."""
    old = new = 0
    for i in range(count):
        text = (tree / f"m{i:03d}.py").read_text()
        body = f"X{i} = {i}\n" * 40
        assert text in (IMPORT + body, MOVED + body), f"m{i:03d}.py is neither old nor new"
        old, new = old + (text == IMPORT + body), new + (text == MOVED + body)
    return old, new


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_one_signal_stops_the_run_with_every_file_old_or_new(tree, map_file, sig, status):
    count = 300
    proc = _start_big_run(tree, map_file, count, "-j", "2")
    os.killpg(proc.pid, sig)  # as a terminal does: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err.decode()
    old, new = _states(tree, count)
    assert new >= 1 and old >= 1, "the run was not stopped in the middle"
    assert sorted(p.name for p in tree.iterdir()) == [f"m{i:03d}.py" for i in range(count)]
    assert b"every file is either as it was or fully migrated" in err


@pytest.mark.parametrize("hard_links", [False, True], ids=["renamed", "in-place"])
def test_sigkill_in_the_middle_leaves_no_temporary_file(tree, map_file, hard_links):
    count = 300
    # With a second name outside the tree, each file is rewritten in its own inode.
    others = tree.parent / "others" if hard_links else None
    proc = _start_big_run(tree, map_file, count, "-j", "1", link_into=others)
    proc.kill()  # SIGKILL to the run alone; nothing of it can clean up
    proc.communicate(timeout=60)
    expected = [f"m{i:03d}.py" for i in range(count)]
    # The guard process removes a temporary name left between link and rename, and puts
    # back a file whose in-place write was cut short, as soon as the run's pipe closes;
    # give it a moment to do so.
    for _ in range(200):
        try:
            if sorted(p.name for p in tree.iterdir()) == expected and _states(tree, count):
                break
        except AssertionError:
            pass
        time.sleep(0.01)
    assert sorted(p.name for p in tree.iterdir()) == expected
    old, new = _states(tree, count)
    assert new >= 1 and old >= 1
    if hard_links:
        assert all((tree / name).stat().st_nlink == 2 for name in expected)


def test_the_guard_removes_a_temporary_name_when_the_run_is_killed_between_link_and_rename(
        tmp_path):
    """The one moment a temporary file has a name, made to last: the run is killed there."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from mm_schedule.codemods.workspace.writing import TempGuard\n"
        "guard = TempGuard.start()\n"
        "name = Path(sys.argv[1]) / '.a.py.1.0.mm-schedule-codemod.tmp'\n"
        "guard.pending(name)\n"
        "name.write_text('new content')\n"
        "print('linked', flush=True)\n"
        "time.sleep(3600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "linked\n"
    assert [p.name for p in tmp_path.iterdir()] == [".a.py.1.0.mm-schedule-codemod.tmp"]
    proc.kill()
    proc.wait(timeout=60)
    for _ in range(500):
        if not list(tmp_path.iterdir()):
            break
        time.sleep(0.01)
    assert list(tmp_path.iterdir()) == []


def test_the_guard_puts_back_a_file_whose_in_place_write_a_kill_interrupted(tmp_path):
    """A hard-linked file is rewritten in its own inode; killed halfway through that
    write, the run leaves the old content, not a mix."""
    target = tmp_path / "linked.py"
    target.write_bytes(b"old content\n" * 1000)
    os.link(target, tmp_path / "other_name.py")
    finished = tmp_path / "finished.py"
    finished.write_bytes(b"old\n")
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from mm_schedule.codemods.workspace.writing import TempGuard\n"
        "target, finished = Path(sys.argv[1]), Path(sys.argv[2])\n"
        "guard = TempGuard.start()\n"
        "guard.writing(finished, finished.read_bytes())\n"
        "finished.write_bytes(b'new\\n')\n"
        "guard.written(finished)\n"
        "guard.writing(target, target.read_bytes())\n"
        "with open(target, 'r+b') as f:\n"
        "    f.write(b'NEW' * 10)\n"  # half written
        "print('halfway', flush=True)\n"
        "time.sleep(3600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(target), str(finished)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "halfway\n"
    assert target.read_bytes().startswith(b"NEW")
    proc.kill()
    proc.wait(timeout=60)
    for _ in range(500):
        if target.read_bytes() == b"old content\n" * 1000:
            break
        time.sleep(0.01)
    assert target.read_bytes() == b"old content\n" * 1000
    assert (tmp_path / "other_name.py").read_bytes() == b"old content\n" * 1000
    assert finished.read_bytes() == b"new\n"  # a write that ended is kept


def test_a_file_saved_by_the_user_during_the_run_keeps_the_edit(tree, map_file):
    """No hook: the user appends to the last file while the run is writing the first ones
    (after the run read it, before it writes it)."""
    count = 60
    proc = _start_big_run(tree, map_file, count, "-j", "1")
    last = tree / f"m{count - 1:03d}.py"
    with open(last, "a") as handle:
        handle.write("USER_EDIT = 1\n")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert last.read_text() == MOVED + f"X{count - 1} = {count - 1}\n" * 40 + "USER_EDIT = 1\n"
    assert _states(tree, count - 1) == (0, count - 1)
