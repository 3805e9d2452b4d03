"""The one relative-import resolver, at its edges: each dot climbs exactly one package,
and dots that climb above the top-level package resolve to nothing (Python raises there),
for the engine and for ``derive`` alike."""

from __future__ import annotations

import ast

import pytest

from mm_schedule.codemods.engine.resolve import (
    absolute_module,
    package_for,
    relative_base,
    relative_tail,
)
from mm_schedule.codemods.movemap.bindings import resolve_import
from mm_schedule.errors import MoveMapError


@pytest.mark.parametrize(("package", "level", "base"), [
    ("sglang.srt.managers", 1, "sglang.srt.managers"),
    ("sglang.srt.managers", 2, "sglang.srt"),
    ("sglang.srt.managers", 3, "sglang"),  # the top-level package itself
    ("sglang.srt.managers", 4, None),  # above it
    ("sglang.srt.managers", 9, None),
    ("sglang", 1, "sglang"),
    ("sglang", 2, None),
    ("sglang.srt.managers", 0, None),  # not relative
    ("", 1, None),  # a script outside any package
    (None, 1, None),
])
def test_each_dot_climbs_one_package_and_never_above_the_top(package, level, base):
    assert relative_base(package, level) == base


def test_absolute_and_relative_names_follow_the_same_climb():
    package = "sglang.srt.managers"
    assert absolute_module(package, 1, "mm_utils") == "sglang.srt.managers.mm_utils"
    assert absolute_module(package, 2, "managers.mm_utils") == "sglang.srt.managers.mm_utils"
    assert absolute_module(package, 3, "srt.managers.mm_utils") == "sglang.srt.managers.mm_utils"
    assert absolute_module(package, 3, None) == "sglang"
    assert absolute_module(package, 4, "sglang.srt.managers.mm_utils") is None
    assert absolute_module(package, 0, "x.y") == "x.y"
    assert relative_tail(package, 3, "sglang.srt.managers.mm_schedule") == "srt.managers.mm_schedule"
    assert relative_tail(package, 3, "sglang") == ""
    assert relative_tail(package, 3, "other.mod") is None
    assert relative_tail(package, 4, "sglang.srt") is None


def test_the_engine_rewrites_up_to_the_top_package_and_not_above(migrate):
    top = "from ...srt.managers.mm_utils import get_embedding_chunk\n"
    text, findings = migrate(top, package="sglang.srt.managers")
    assert text == "from ...srt.managers.mm_schedule import get_embedding_chunk\n"
    assert [f.code for f in findings] == ["MMS001"]
    two = "from ..managers.mm_utils import get_embedding_chunk\n"
    assert migrate(two, package="sglang.srt.managers")[0] == "from ..managers.mm_schedule import get_embedding_chunk\n"
    # four dots from sglang.srt.managers climb above ``sglang``: Python refuses the import,
    # so it names no module, not sglang.srt.managers.mm_utils
    above = "from ....sglang.srt.managers.mm_utils import get_embedding_chunk\n"
    assert migrate(above, package="sglang.srt.managers") == (above, [])


def _import(text: str) -> ast.ImportFrom:
    node = ast.parse(text).body[0]
    assert isinstance(node, ast.ImportFrom)
    return node


def test_derive_resolves_with_the_same_climb():
    assert resolve_import(_import("from ...x import y"), "a.b.c", "f.py") == "a.x"
    assert resolve_import(_import("from ... import y"), "a.b.c", "f.py") == "a"
    assert resolve_import(_import("from . import y"), "a", "f.py") == "a"
    assert resolve_import(_import("from x.z import y"), "a", "f.py") == "x.z"
    with pytest.raises(MoveMapError, match=r"f.py:1: relative import beyond the top-level package 'a.b.c'"):
        resolve_import(_import("from ....x import y"), "a.b.c", "f.py")
    with pytest.raises(MoveMapError, match="beyond the top-level package ''"):
        resolve_import(_import("from . import y"), "", "f.py")


def _fork_layout(root):
    """A fork's ``python/sglang/...``: ``sglang`` is a regular package, ``srt`` and
    ``managers`` are namespace folders inside it (no ``__init__.py``)."""
    managers = root / "python" / "sglang" / "srt" / "managers"
    managers.mkdir(parents=True)
    (root / "python" / "sglang" / "__init__.py").write_text("")
    user = managers / "scheduler.py"
    user.write_text("from .mm_utils import get_embedding_chunk\n")
    return user


def test_namespace_folders_inside_a_package_count_as_package_levels(tmp_path):
    user = _fork_layout(tmp_path)
    # each namespace folder is one level; the climb stops above the regular package
    assert package_for(user, tmp_path) == "sglang.srt.managers"
    assert package_for(user.parent.parent / "x.py", tmp_path) == "sglang.srt"
    assert package_for(tmp_path / "python" / "sglang" / "x.py", tmp_path) == "sglang"
    # a namespace folder with no regular package above it is no package: root-relative
    loose = tmp_path / "tools" / "ns"
    loose.mkdir(parents=True)
    assert package_for(loose / "x.py", tmp_path) == "tools.ns"


def test_a_relative_import_in_a_forks_namespace_folder_is_rewritten(tmp_path, monkeypatch, cli_main,
                                                                  map_file):
    user = _fork_layout(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli_main("--write", "python", map_file=map_file) == 0
    assert user.read_text() == "from .mm_schedule import get_embedding_chunk\n"
