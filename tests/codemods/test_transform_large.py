"""Large files go through ``segments``: only statements that mention something the map
cares about are parsed by libcst. The result must be exactly what the whole-file pass
gives, findings at the same positions, and memory must stay proportional to the part
that matters."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from mm_schedule.codemods.engine.transform import migrate_source
from mm_schedule.codemods.fastpath.segments import reduce, statement_spans

from .conftest import WHOLE, assert_segmented_pass_matches, release_sources

RELEVANT = [
    '''
def use_{i}(x):
    """Docstring naming sglang.srt.managers.mm_utils."""
    return mm_utils.get_embedding_chunk(x) + get_embedding_chunk(x)
''',
    '''
@decorator(
    "arg",
)
def patched_{i}():
    with mock.patch("sglang.srt.managers.mm_utils._get_multimodal_mask"):
        return embedding_cache
''',
    '''
class Holder{i}:
    # a comment naming mm_utils
    value = mm_utils._is_hip
''',
    '''
try:
    from sglang.srt.managers.mm_utils import get_embedding_chunk as chunk_{i}
except ImportError:
    chunk_{i} = None
else:
    pass
''',
]

PLAIN = [
    '''
def plain_{i}(a, b=2):
    text = """
def not_a_statement():
    return 1
"""
    return a + b, text
''',
    '''
x_{i} = 1; y_{i} = 2
''',
    '''
if x_{i} > 0:
    z_{i} = [
1, 2,
    ]
elif x_{i} < 0:
    z_{i} = []
else:
    z_{i} = None
''',
    '''
total_{i} = 1 + \\
    2
# a comment between statements
''',
    '''
@decorator
class Plain{i}:
    """With a docstring."""

    def method(self):
        return 'it''s' + "\\"quoted\\""
        # trailing comment in the block
''',
]

HEADER = '''"""A generated module."""
import unittest.mock as mock

from sglang.srt.managers import mm_utils
from sglang.srt.managers.mm_utils import (
    get_embedding_chunk,  # keep me
    embedding_cache,
)
'''


def _generated(seed: int, statements: int, relevant_share: float, newline: str = "\n") -> bytes:
    rng = random.Random(seed)
    parts = [HEADER]
    for i in range(statements):
        pool = RELEVANT if rng.random() < relevant_share else PLAIN
        parts.append(rng.choice(pool).format(i=i))
    return "".join(parts).replace("\n", newline).encode()


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_segmented_pass_equals_whole_file_pass(move_map, seed, newline):
    source = _generated(seed, 120, 0.15, newline)
    assert reduce(source, move_map) is not None, "nothing was left out: the test checks nothing"
    whole = migrate_source(source, move_map, path="big.py", package="app", segment_above=WHOLE)
    parts = migrate_source(source, move_map, path="big.py", package="app", segment_above=0)
    assert whole.new_source is not None
    assert parts.new_source == whole.new_source
    assert parts.findings == whole.findings


def test_statement_spans_match_the_parser(move_map):
    """Every span the scanner reports is exactly one or more whole top-level statements."""
    import ast

    source = _generated(7, 80, 0.3)
    spans = statement_spans(source)
    starts = {node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
              for node in ast.parse(source).body}
    line_of = {0: 1}
    line = 1
    for k, byte in enumerate(source):
        if byte == 10:
            line += 1
            line_of[k + 1] = line
    span_lines = {line_of[start] for start, _ in spans}
    assert span_lines <= starts and len(span_lines) > 50
    for start, end in spans:
        ast.parse(source[start:end])  # each span is valid on its own


def test_memory_follows_the_relevant_part(move_map):
    """A 1 MB file with few relevant statements is migrated in a small fraction of what
    parsing it whole would hold (libcst needs several hundred bytes per source byte)."""
    source = _generated(11, 6000, 0.01)
    assert len(source) > 500_000
    tracemalloc.start()
    try:
        outcome = migrate_source(source, move_map, path="big.py", package="app")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.new_source is not None
    assert peak < 40 * len(source), f"peak {peak / 1e6:.0f} MB for {len(source) / 1e6:.1f} MB of source"
    assert outcome.new_source.count(b"sglang.srt.managers.mm_schedule") >= 1


@pytest.mark.parametrize("prefix", [b"\xef\xbb\xbf", b"# -*- coding: latin-1 -*-\n", b"\x0c\n"])
@pytest.mark.parametrize("newline", ["\r", "\r\n"])
def test_segmented_pass_keeps_odd_bytes(move_map, prefix, newline):
    """Byte-order mark, coding cookie, form feed and lone carriage returns survive the
    markers exactly as the whole-file pass keeps them."""
    if prefix.startswith(b"#") and newline == "\r":
        pytest.skip("libcst finds no coding cookie in a file whose lines end in lone CRs")
    body = _generated(5, 60, 0.1, newline).replace(b"A generated module.", b"caf\xc3\xa9" if prefix[:1] != b"#" else b"caf\xe9")
    body += ("\x0c" + newline + "def last():" + newline + "    return 1" + newline).encode()
    source = prefix.replace(b"\n", newline.encode()) + body
    assert reduce(source, move_map) is not None
    whole = migrate_source(source, move_map, path="odd.py", package="app", segment_above=WHOLE)
    parts = migrate_source(source, move_map, path="odd.py", package="app", segment_above=0)
    assert whole.new_source is not None
    assert parts.new_source == whole.new_source
    assert parts.findings == whole.findings


@pytest.mark.realworld
def test_segmented_pass_equals_whole_file_pass_on_a_real_release():
    """Every file of SGLang 0.5.17 that mentions either module: forcing the segmented
    pass changes neither the output nor the findings."""
    from mm_schedule.codemods.movemap.schema import load_map

    move_map = load_map()
    checked = 0
    for name, package, source in release_sources("0.5.17"):
        if b"mm_utils" in source or b"mm_schedule" in source:
            assert_segmented_pass_matches(source, move_map, name, package)
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("newline", ["\n", "\r"])
def test_constants_in_left_out_statements_still_build_patch_targets(move_map, newline):
    """A module path kept in a constant reaches a patch target or a ``sys.modules`` key
    in another statement; neither statement mentions the map's words on its own."""
    source = (HEADER + '''
PREFIX = "sglang.srt.managers."
TARGET = "sglang.srt.managers.mm_utils._is_hip"
KEY = PREFIX + "mm_utils"


def patch_prefix():
    return mock.patch(PREFIX + "mm_utils.get_embedding_chunk")


def patch_target():
    return mock.patch(TARGET)


def stub(module):
    sys.modules[PREFIX + "mm_utils"] = module
''' + "".join(p.format(i=i) for i in range(40) for p in PLAIN)).replace("\n", newline).encode()
    assert reduce(source, move_map) is not None
    whole = migrate_source(source, move_map, path="c.py", package="app", segment_above=WHOLE)
    parts = migrate_source(source, move_map, path="c.py", package="app", segment_above=0)
    assert {"MMS012", "MMS013"} <= {f.code for f in whole.findings}
    assert parts.new_source == whole.new_source
    assert parts.findings == whole.findings


def test_an_import_of_a_package_above_the_old_module_is_kept(move_map):
    """``import sglang.srt`` names none of the map's words, yet uses reach the old module
    through it: the segmented pass must keep the import and rewrite those uses."""
    source = ('"""Top package only."""\nimport os\nimport sglang.srt\n'
              + "".join(p.format(i=i) for i in range(30) for p in PLAIN)
              + "\n\ndef use(x):\n    return sglang.srt.managers.mm_utils.get_embedding_chunk(x)\n").encode()
    assert reduce(source, move_map) is not None
    whole = migrate_source(source, move_map, path="t.py", package="app", segment_above=WHOLE)
    parts = migrate_source(source, move_map, path="t.py", package="app", segment_above=0)
    assert whole.new_source is not None and b"mm_schedule.get_embedding_chunk" in whole.new_source
    assert parts.new_source == whole.new_source
    assert parts.findings == whole.findings
