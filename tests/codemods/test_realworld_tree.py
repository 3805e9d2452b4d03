"""Real world: the codemod over SGLang 0.5.17's whole tree makes every reference into
``mm_utils`` / ``mm_schedule`` resolve against 0.5.18, and a second run changes nothing.

Opt-in (marker ``realworld``); skipped when the package registry cannot be reached.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import realworld_helpers

pytestmark = pytest.mark.realworld

FINDING_KEYS = {"path", "line", "column", "code", "symbol", "message", "fixed"}

# Reference forms the wheel's own tree does not use, placed inside the tree so relative
# imports resolve the way they would in a fork. Each line marked "breaks" is a reference
# that 0.5.18 no longer satisfies.
PROBE_PATH = "sglang/srt/mm_codemod_probe.py"
PROBE = '''\
"""Reference forms for the real-world codemod test."""
from unittest import mock

import sglang.srt.managers.mm_utils
from sglang.srt.managers.mm_utils import _get_chunked_embedding_full, embed_mm_inputs  # breaks
from .managers import mm_utils as mmu
from .managers.mm_utils import MultimodalDataItem as Item  # breaks


def use():
    from sglang.srt.managers.mm_utils import (
        get_embedding_chunk,  # breaks; this comment stays
        general_mm_embed_routine,
    )

    return (
        get_embedding_chunk,
        general_mm_embed_routine,
        mmu._get_multimodal_mask,  # breaks
        mmu.embed_mm_inputs,
        sglang.srt.managers.mm_utils._move_items_to_device,  # breaks
        Item,
        _get_chunked_embedding_full,
        embed_mm_inputs,
    )


@mock.patch("sglang.srt.managers.mm_utils._adjust_embedding_length")  # breaks
def patched(fake):
    return fake
'''
PROBE_BREAKS = {
    ("from-import", "_get_chunked_embedding_full"), ("from-import", "MultimodalDataItem"),
    ("from-import", "get_embedding_chunk"), ("attribute", "_get_multimodal_mask"),
    ("attribute", "_move_items_to_device"), ("string", "_adjust_embedding_length"),
}


rw = realworld_helpers()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    old_wheel, new_wheel = rw.sglang_wheel("0.5.17"), rw.sglang_wheel("0.5.18")
    root = tmp_path_factory.mktemp("sglang-0.5.17")
    count = rw.extract_python_tree(old_wheel, root)
    assert count > 2000, f"{old_wheel.name}: only {count} Python files"
    (root / PROBE_PATH).write_text(PROBE)
    return root, rw.release_bindings(new_wheel)


def test_the_static_check_sees_what_the_split_broke(tree):
    """Negative control: before the codemod, the check must flag the 0.5.17 tree."""
    root, bindings = tree
    before, unparsable = rw.unresolved_in_tree(root, bindings)
    assert unparsable == []
    # SGLang's own model file whose import broke silently in 0.5.18.
    assert any(
        p.path == "sglang/srt/models/sarashina2_vision.py" and p.name == "MultimodalDataItem"
        for p in before
    ), before
    assert {(p.form, p.name) for p in before if p.path == PROBE_PATH} == PROBE_BREAKS


def test_codemod_makes_every_reference_resolve_and_is_idempotent(tree, tmp_path):
    from mm_schedule.codemods.cli import main

    root, bindings = tree
    first = tmp_path / "first.json"
    rc = main([str(root), "--write", "--json", str(first), "-j", "2"])
    assert rc in (0, 1), f"exit status {rc}: some files could not be parsed"

    after, unparsable = rw.unresolved_in_tree(root, bindings)
    assert unparsable == []
    assert after == [], "\n".join(map(str, after))

    report = json.loads(first.read_text())
    assert all(FINDING_KEYS <= set(f) for f in report["findings"])
    fixed_paths = {Path(f["path"]).as_posix() for f in report["findings"] if f["fixed"]}
    for expected in ("sglang/srt/models/sarashina2_vision.py", PROBE_PATH):
        assert any(p.endswith(expected) for p in fixed_paths), (expected, sorted(fixed_paths))
    probe = (root / PROBE_PATH).read_text()
    assert "# breaks; this comment stays" in probe
    assert "sglang.srt.managers.mm_schedule._adjust_embedding_length" in probe

    digest = rw.tree_digest(root)
    second = tmp_path / "second.json"
    rc = main([str(root), "--write", "--json", str(second), "-j", "2"])
    assert rc in (0, 1)
    assert rw.tree_digest(root) == digest, "the second run changed files"
    leftover = json.loads(second.read_text())["findings"]
    assert [f for f in leftover if f["fixed"]] == []
    # --check agrees: exit 1 exactly when report-only findings remain.
    assert main([str(root), "--check"]) == (1 if leftover else 0)
