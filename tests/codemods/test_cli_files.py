"""--write never loses a user's data: links, ownership, attributes, line endings,
edits made during the run, failed writes, read-only folders."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest

from mm_schedule.codemods import pipeline

IMPORT = b"from sglang.srt.managers.mm_utils import get_embedding_chunk, hash_feature"
SPLIT = (b"from sglang.srt.managers.mm_schedule import get_embedding_chunk",
         b"from sglang.srt.managers.mm_utils import hash_feature")
MOVING = IMPORT + b"\n"
MOVED = b"\n".join(SPLIT) + b"\n"


def _names(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_symlinks_write_their_target_once_and_links_out_of_the_tree_are_left(
        tree, tmp_path, map_file, capsys, cli_main):
    (tree / "real.py").write_bytes(MOVING)
    (tree / "sub").mkdir()
    for link in ("l1.py", "l2.py"):
        os.symlink("real.py", tree / link)
    os.symlink("../real.py", tree / "sub" / "l3.py")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "out.py").write_bytes(MOVING)
    os.symlink(outside / "out.py", tree / "lout.py")
    os.symlink(outside, tree / "linked_folder")

    report = tmp_path / "r.json"
    assert cli_main("--write", "-v", ".", "--json", report, map_file=map_file) == 0
    assert (tree / "real.py").read_bytes() == MOVED
    assert all(os.path.islink(tree / name) for name in ("l1.py", "l2.py", "sub/l3.py", "lout.py"))
    assert (outside / "out.py").read_bytes() == MOVING
    doc = json.loads(report.read_text())
    assert doc["changed_files"] == ["real.py"]
    assert [f["path"] for f in doc["findings"]] == ["real.py"]
    err = capsys.readouterr().err
    assert "lout.py: skipped, symlink to" in err and "outside the tree" in err
    assert "linked_folder: skipped, symlinked folder (not followed)" in err

    # Named on the command line, a link out of the tree is followed: its target is written.
    assert cli_main("--write", "lout.py", map_file=map_file) == 0
    assert (outside / "out.py").read_bytes() == MOVED
    assert os.path.islink(tree / "lout.py")


def test_hard_links_owner_group_mode_and_attributes_are_kept(tree, tmp_path, map_file, cli_main):
    linked = tree / "linked.py"
    linked.write_bytes(MOVING)
    other_name = tmp_path / "elsewhere.py"  # a second name for the same file, not walked
    os.link(linked, other_name)
    owned = tree / "owned.py"
    owned.write_bytes(MOVING)
    os.chown(owned, 4321, 8765)
    os.chmod(owned, 0o751)
    try:
        os.setxattr(owned, "user.origin", b"kept")
        has_xattr = True
    except OSError:
        has_xattr = False
    inode = linked.stat().st_ino

    assert cli_main("--write", ".", map_file=map_file) == 0
    assert linked.read_bytes() == MOVED and other_name.read_bytes() == MOVED
    assert linked.stat().st_ino == inode and linked.stat().st_nlink == 2
    info = owned.stat()
    assert owned.read_bytes() == MOVED
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 8765, 0o751)
    if has_xattr:
        assert os.getxattr(owned, "user.origin") == b"kept"
    assert _names(tree) == ["linked.py", "owned.py"]


@pytest.mark.parametrize(
    "before, after",
    [
        (b"x = 1\r\n" + IMPORT + b"\r\ny = 2\r\n", b"x = 1\r\n" + b"\r\n".join(SPLIT) + b"\r\ny = 2\r\n"),
        (b"x = 1\r" + IMPORT + b"\ry = 2\r", b"x = 1\r" + b"\r".join(SPLIT) + b"\ry = 2\r"),
        (b"x = 1\n\x0c\n" + IMPORT + b"\n\x0cy = 2\n",
         b"x = 1\n\x0c\n" + b"\n".join(SPLIT) + b"\n\x0cy = 2\n"),
        (b"\xef\xbb\xbf" + IMPORT + b"\ns = 'a\xe2\x80\xa8b'",
         b"\xef\xbb\xbf" + b"\n".join(SPLIT) + b"\ns = 'a\xe2\x80\xa8b'"),
    ],
    ids=["crlf", "lone-cr", "form-feed", "bom-u2028-no-final-newline"],
)
def test_line_endings_and_odd_bytes_are_kept(tree, map_file, before, after, cli_main):
    (tree / "f.py").write_bytes(before)
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert (tree / "f.py").read_bytes() == after


def test_an_edit_made_during_the_run_is_kept_and_migrated(tree, map_file, monkeypatch, cli_main):
    target = tree / "a.py"
    target.write_bytes(MOVING)
    real_replace = pipeline.replace
    edits = []

    def edit_first(snapshot, data, guard=None):
        if not edits:  # the user saves the file between the codemod's read and its write
            edits.append(1)
            with open(snapshot.path, "ab") as handle:
                handle.write(b"USER_EDIT = 1\n")
        return real_replace(snapshot, data, guard)

    monkeypatch.setattr(pipeline, "replace", edit_first)
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert target.read_bytes() == MOVED + b"USER_EDIT = 1\n"


def test_a_file_that_keeps_changing_is_left_with_the_users_content(tree, map_file, monkeypatch,
                                                                   capsys, cli_main):
    target = tree / "a.py"
    target.write_bytes(MOVING)
    (tree / "b.py").write_bytes(MOVING)
    real_replace = pipeline.replace

    def always_edit(snapshot, data, guard=None):
        if snapshot.path.name == "a.py":
            with open(snapshot.path, "ab") as handle:
                handle.write(b"# edited\n")
        return real_replace(snapshot, data, guard)

    monkeypatch.setattr(pipeline, "replace", always_edit)
    report = tree.parent / "r.json"
    assert cli_main("--write", ".", "--json", report, map_file=map_file) == 2
    assert target.read_bytes() == MOVING + b"# edited\n# edited\n"
    assert (tree / "b.py").read_bytes() == MOVED
    doc = json.loads(report.read_text())
    assert doc["changed_files"] == ["b.py"]
    assert doc["failed_files"][0]["path"] == "a.py"
    out, err = capsys.readouterr()
    assert "a.py: MMS910 [error] changed again while being migrated" in err
    assert "a.py:1:42: MMS001 [fixable]" in out and "b.py:1:42: MMS001 [fixed]" in out


def _chattr(flag, path):
    if shutil.which("chattr") is None:
        pytest.skip("chattr not installed")
    proc = subprocess.run(["chattr", flag, str(path)], capture_output=True)
    if proc.returncode:
        pytest.skip(f"cannot make files immutable here: {proc.stderr.decode().strip()}")


def test_a_file_that_cannot_be_written_is_an_error_not_fixed(tree, map_file, capsys, cli_main):
    locked = tree / "locked.py"
    locked.write_bytes(MOVING)
    (tree / "free.py").write_bytes(MOVING)
    _chattr("+i", locked)  # immutable: even root cannot replace or write it
    try:
        report = tree.parent / "r.json"
        assert cli_main("--write", ".", "--json", report, map_file=map_file) == 2
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert locked.read_bytes() == MOVING
    assert (tree / "free.py").read_bytes() == MOVED
    doc = json.loads(report.read_text())
    assert doc["changed_files"] == ["free.py"]
    assert doc["summary"]["files_changed"] == 1 and doc["summary"]["fixed"] == 1
    assert [f["status"] for f in doc["findings"] if f["path"] == "locked.py"] == ["fixable"]
    out, err = capsys.readouterr()
    assert "locked.py: MMS909 [error] cannot write" in err and "locked.py:1:42: MMS001 [fixable]" in out
    assert _names(tree) == ["free.py", "locked.py"]


def test_a_read_only_folder_with_a_writable_file_is_written_in_place(tree, map_file, cli_main):
    folder = tree / "frozen"
    folder.mkdir()
    target = folder / "a.py"
    target.write_bytes(MOVING)
    inode = target.stat().st_ino
    _chattr("+i", folder)  # no new names in the folder: no temporary file, no rename
    try:
        assert cli_main("--write", ".", map_file=map_file) == 0
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert target.read_bytes() == MOVED and target.stat().st_ino == inode
    assert _names(folder) == ["a.py"]


def test_a_file_that_takes_too_long_is_given_up_and_the_rest_is_written(tree, map_file,
                                                                         monkeypatch, capsys, cli_main):
    import time

    real = pipeline.migrate_source

    def hangs_on_slow(source, move_map, *, path, package, gate, **options):
        if path == "slow.py":
            time.sleep(3600)
        return real(source, move_map, path=path, package=package, gate=gate, **options)

    monkeypatch.setattr(pipeline, "migrate_source", hangs_on_slow)
    (tree / "slow.py").write_bytes(MOVING)
    (tree / "fast.py").write_bytes(MOVING)
    assert cli_main("--write", ".", "--timeout", "2", map_file=map_file) == 2
    assert (tree / "slow.py").read_bytes() == MOVING
    assert (tree / "fast.py").read_bytes() == MOVED
    assert "slow.py: MMS908 [error] took longer than 2 s; file left as is" in capsys.readouterr().err


def test_when_the_owner_cannot_be_kept_the_file_is_written_in_place(tree, map_file, monkeypatch, cli_main):
    """What a user who is not root meets with a group-writable file of someone else:
    a new inode could not be given the old owner, so the old inode is rewritten."""
    from mm_schedule.codemods.workspace import writing

    target = tree / "theirs.py"
    target.write_bytes(MOVING)
    inode = target.stat().st_ino

    def refuse(fd, uid, gid):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(writing.os, "fchown", refuse)
    assert cli_main("--write", ".", map_file=map_file) == 0
    assert target.read_bytes() == MOVED and target.stat().st_ino == inode
    assert _names(tree) == ["theirs.py"]


def test_a_file_removed_during_the_run_is_not_brought_back(tree, map_file, monkeypatch, capsys,
                                                           cli_main):
    (tree / "a.py").write_bytes(MOVING)
    (tree / "b.py").write_bytes(MOVING)
    real_replace = pipeline.replace

    def remove_first(snapshot, data, guard=None):
        if snapshot.path.name == "a.py":
            os.unlink(snapshot.path)
        return real_replace(snapshot, data, guard)

    monkeypatch.setattr(pipeline, "replace", remove_first)
    assert cli_main("--write", ".", map_file=map_file) == 2
    assert not (tree / "a.py").exists() and (tree / "b.py").read_bytes() == MOVED
    err = capsys.readouterr().err
    assert "a.py: MMS910 [error] removed while being migrated; not written\n" in err


def test_an_edit_between_the_temporary_copy_and_the_rename_is_kept(tmp_path, monkeypatch):
    """The window after the first compare: the new content is in the temporary file, the
    user saves, then the rename would have thrown the save away."""
    from mm_schedule.codemods.workspace import writing

    path = tmp_path / "a.py"
    path.write_bytes(MOVING)
    snapshot = writing.read_snapshot(path)
    real_write_all = writing._write_all
    edits = []

    def write_then_user_saves(fd, data):
        real_write_all(fd, data)
        if not edits:
            edits.append(fd)
            path.write_bytes(b"# saved by the user meanwhile\n" + MOVING)

    monkeypatch.setattr(writing, "_write_all", write_then_user_saves)
    with pytest.raises(writing.FileChanged):
        writing.replace(snapshot, b"new content\n")
    assert edits, "the window was never reached"
    assert path.read_bytes() == b"# saved by the user meanwhile\n" + MOVING
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]  # no temporary file left
