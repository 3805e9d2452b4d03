"""Names bound once by a module-level import skip libcst's scope analysis
(``engine/plain_names.py``); the result must be what the scope analysis gives. Every
case is migrated both ways and compared: edits, findings, positions."""

from __future__ import annotations

import random
import textwrap

import pytest

from mm_schedule.codemods.engine import facts as facts_module
from mm_schedule.codemods.engine.plain_names import PlainNames
from mm_schedule.codemods.engine.transform import migrate_source

HEAD = "from sglang.srt.managers import mm_utils\n"
PARTS = [
    "x = mm_utils.get_embedding_chunk(1)\n",
    "def f():\n    return mm_utils._get_multimodal_mask\n",
    "class C:\n    attr = mm_utils.PerImageRequestInfo\n    def m(self):\n        return mm_utils.get_embedding_chunk\n",
    "def g(mm_utils):\n    return mm_utils.get_embedding_chunk\n",  # a parameter shadows it
    "def h():\n    mm_utils = None\n    return mm_utils.get_embedding_chunk\n",  # a local shadows it
    "def k():\n    global mm_utils\n    mm_utils = None\n",
    "del mm_utils\n",
    "y: 'mm_utils.PerImageRequestInfo' = None\n",  # a string annotation reads it too
    "z = [mm_utils for mm_utils in range(3)]\n",
    "w = dict(mm_utils=1)\nv = w.mm_utils\n",  # a keyword and an attribute: no reads
    "import sglang.srt.managers.mm_schedule as mm_schedule\nu = mm_utils.get_embedding_chunk\n",
    "from sglang.srt.managers import mm_schedule\nt = mm_utils.init_mm_embedding_cache\n",
    "try:\n    from sglang.srt.managers import mm_utils as m2\nexcept ImportError:\n    m2 = None\ns = m2.get_embedding_chunk\n",
    "getattr(mm_utils, 'get_embedding_chunk')\n",
    "from unittest import mock\nmock.patch.object(mm_utils, 'get_embedding_chunk')\n",
    "mm_utils.get_embedding_chunk = None\n",
    "def lazy():\n    from sglang.srt.managers import mm_utils as local\n    return local.get_embedding_chunk\n",
    "__all__ = ['mm_utils']\n",
    "import sglang.srt.managers.mm_utils as m3\nr = m3._is_hip\n",
    "q = mm_utils\n",
    "from unittest import mock\nmock.patch('sglang.srt.managers.mm_utils.get_embedding_chunk')\n",
    "from typing import List\np: List['mm_utils.PerImageRequestInfo'] = []\n",
    "from typing import cast\no = cast('mm_utils.PerImageRequestInfo', None)\n",
]


def _both(source: str, move_map, monkeypatch):
    fast = migrate_source(source, move_map, path="t.py", package="app")
    with monkeypatch.context() as patch:
        patch.setattr(facts_module.FileFacts, "plain", property(lambda self: frozenset()))
        slow = migrate_source(source, move_map, path="t.py", package="app")
    return fast, slow


@pytest.mark.parametrize("part", PARTS)
def test_each_shape_alone_gives_what_scope_analysis_gives(part, move_map, monkeypatch):
    fast, slow = _both(HEAD + part, move_map, monkeypatch)
    assert (fast.new_source, fast.findings) == (slow.new_source, slow.findings)


def test_random_mixtures_give_what_scope_analysis_gives(move_map, monkeypatch):
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    for _ in range(40):
        parts = rng.sample(PARTS, rng.randint(1, 6))
        source = HEAD + "".join(parts)
        fast, slow = _both(source, move_map, monkeypatch)
        assert (fast.new_source, fast.findings) == (slow.new_source, slow.findings), (seed, source)


@pytest.mark.parametrize("source, plain", [
    (HEAD + "x = mm_utils.a\n", {"mm_utils"}),
    (HEAD + "def f(mm_utils):\n    pass\n", set()),
    (HEAD + "for mm_utils in []:\n    pass\n", set()),
    (HEAD + "with open() as mm_utils:\n    pass\n", set()),
    (HEAD + "try:\n    pass\nexcept E as mm_utils:\n    pass\n", set()),
    (HEAD + "def k():\n    nonlocal mm_utils\n", set()),
    (HEAD + "(mm_utils := 1)\n", set()),
    (HEAD + "class mm_utils:\n    pass\n", set()),
    (HEAD + "s = 'sglang.srt.managers.mm_utils.x'\n", {"mm_utils"}),  # a plain string
    (HEAD + "def f(a: 'mm_utils.X') -> None:\n    pass\n", set()),
    (HEAD + "def f() -> 'mm_utils.X':\n    pass\n", set()),
    (HEAD + "x: List['mm_utils.X'] = []\n", set()),
    (HEAD + "y = d['mm_utils']\n", set()),
    (HEAD + "z = typing.cast('mm_utils.X', None)\n", set()),
    (HEAD + "T = TypeVar('T', bound='mm_utils.X')\n", set()),
    (HEAD + "def f():\n    import os\n", {"mm_utils"}),  # os: bound inside a function
    ("def f():\n    from sglang.srt.managers import mm_utils\n", set()),
    ("import a.b.c\n", {"a"}),
])
def test_what_counts_as_plain(source, plain):
    assert set(PlainNames.of(textwrap.dedent(source).encode()).names) == plain


@pytest.mark.parametrize("source", [
    HEAD + "from os import *\n",
    HEAD + "match x:\n    case mm_utils:\n        pass\n",
    "def f(:\n",
])
def test_files_whose_bindings_are_not_counted_have_no_plain_names(source):
    assert PlainNames.of(source.encode()) is None


def test_a_plainly_bound_module_is_migrated_without_scope_analysis(move_map, monkeypatch):
    source = (HEAD + PARTS[0] + PARTS[1] + PARTS[2] + "from unittest import mock\n"
              "mock.patch('sglang.srt.managers.mm_utils.get_embedding_chunk')\n")

    def refuse(self):
        raise AssertionError("scope analysis was asked for")

    monkeypatch.setattr(facts_module.FileFacts, "scopes", property(refuse))
    outcome = migrate_source(source, move_map, path="t.py", package="app")
    text = outcome.new_source.decode()
    assert "from sglang.srt.managers import mm_schedule\n" in text
    assert "mm_utils" not in text  # every use moved, so the binding was retargeted whole
    assert len(outcome.findings) == 5
