"""Shared helpers for the transform and CLI tests: a small synthetic move map (so the
tests do not depend on the derived SGLang map's exact contents) and before/after checks."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from mm_schedule.codemods.engine.transform import migrate_source
from mm_schedule.codemods.movemap.schema import MoveMap

WHOLE = 1 << 62  # a segment threshold no file reaches: the whole-file pass
OLD = "sglang.srt.managers.mm_utils"
NEW = "sglang.srt.managers.mm_schedule"

SYNTHETIC_MAP = {
    "header": {"generated_by": "tests/codemods/conftest.py"},
    "old_module": OLD,
    "new_module": NEW,
    "moved": {
        "get_embedding_and_mask": {"kind": "function", "private": False},
        "init_mm_embedding_cache": {"kind": "function", "private": False},
        "get_embedding_chunk": {"kind": "function", "private": False},
        "PerImageRequestInfo": {"kind": "class", "private": False},
        "embedding_cache": {"kind": "variable", "private": False},
        "_get_multimodal_mask": {"kind": "function", "private": True},
        "_adjust_embedding_length": {"kind": "function", "private": True},
        "_is_hip": {"kind": "variable", "private": True},
    },
    "reexported": ["get_embedding_and_mask", "init_mm_embedding_cache"],
    "import_origins": {"MultimodalDataItem": "sglang.srt.managers.schedule_batch"},
    "rebound_globals": ["embedding_cache"],
    "removed": ["old_helper"],
    "unmapped_imports": {"np": "import numpy as np"},
}


@pytest.fixture
def move_map() -> MoveMap:
    return MoveMap.from_dict(SYNTHETIC_MAP)


@pytest.fixture
def map_file(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(SYNTHETIC_MAP))
    return path


@pytest.fixture
def cli_main():
    """The CLI in this process with a given map file, one worker."""
    from mm_schedule.codemods import cli

    def run(*args, map_file):
        return cli.main([*map(str, args), "--map", str(map_file), "-j", "1"])

    return run


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """An empty folder, the working folder for the test."""
    root = tmp_path / "tree"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


def _run(source: str, move_map: MoveMap, package: str | None = "app"):
    """(new source text, findings) for dedented ``source``."""
    outcome = migrate_source(textwrap.dedent(source), move_map, package=package, path="t.py")
    text = outcome.new_source.decode() if outcome.new_source is not None else textwrap.dedent(source)
    return text, outcome.findings


def _assert_migrates(before: str, after: str, move_map: MoveMap, *, package: str | None = "app",
                    codes: list[str] | None = None):
    """CodemodTest-style: ``before`` becomes exactly ``after``, a second run changes
    nothing, and (if given) the finding codes are ``codes`` in source order."""
    got, findings = _run(before, move_map, package)
    assert got == textwrap.dedent(after)
    again = migrate_source(got, move_map, package=package, path="t.py")
    assert again.new_source is None, "second run changed the file again"
    if codes is not None:
        assert [f.code for f in findings] == codes
    return findings


@pytest.fixture
def migrate(move_map):
    """migrate(source, package="app") -> (new text, findings) with the synthetic map."""
    return lambda source, package="app": _run(source, move_map, package)


@pytest.fixture
def check(move_map):
    """check(before, after, package="app", codes=None) -> findings (see _assert_migrates)."""
    return lambda before, after, package="app", codes=None: _assert_migrates(
        before, after, move_map, package=package, codes=codes
    )


@functools.cache
def realworld_helpers():
    """``realworld_check.py`` beside this file, loaded as a module (the tests folder is
    not a package)."""
    path = Path(__file__).with_name("realworld_check.py")
    spec = importlib.util.spec_from_file_location("mm_codemod_realworld_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def release_sources(version: str):
    """``(name, package, source)`` of every ``.py`` file of SGLang ``version``'s wheel, in
    name order (skips the test when the wheel cannot be had)."""
    with zipfile.ZipFile(realworld_helpers().sglang_wheel(version)) as wheel:
        for name in sorted(wheel.namelist()):
            if name.endswith(".py"):
                yield name, name.rsplit("/", 1)[0].replace("/", "."), wheel.read(name)


def assert_segmented_pass_matches(source: bytes, move_map: MoveMap, name: str, package: str) -> None:
    """Forcing the segmented pass changes neither the output nor the findings."""
    whole = migrate_source(source, move_map, path=name, package=package, segment_above=WHOLE)
    assert migrate_source(source, move_map, path=name, package=package, segment_above=0) == whole, name


@pytest.fixture
def codemod_in(monkeypatch, capsysbinary):
    """codemod_in(folder, *args) -> CompletedProcess: the CLI run in this process from
    ``folder``, its stdout and stderr captured as bytes (for tests where starting a
    process is not the point)."""
    import subprocess

    from mm_schedule.codemods import cli

    def run(folder, *args):
        capsysbinary.readouterr()
        with monkeypatch.context() as patched:
            patched.chdir(folder)
            status = cli.main([*map(str, args), "-j", "1"])
        out, err = capsysbinary.readouterr()
        return subprocess.CompletedProcess(args, status, out, err)

    return run
