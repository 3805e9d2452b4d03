"""Large files: top-level functions whose uses of the map's names are simple shapes skip
libcst; the engine plans one copy of each distinct use and the outcome is copied to every
occurrence. The result must be exactly the whole-file pass (bytes and findings), and any
statement with something less plain must go through libcst instead."""

from __future__ import annotations

import random
import re

import pytest

from mm_schedule.codemods.engine.transform import migrate_source
from mm_schedule.codemods.fastpath.segments import reduce, statement_spans, watch_words
from mm_schedule.codemods.fastpath.simple_uses import statement_uses

from .conftest import WHOLE, assert_segmented_pass_matches, release_sources

HEADER = '''"""A generated module."""
import importlib
import unittest.mock as mock

from sglang.srt.managers import mm_utils
import sglang.srt.managers.mm_utils as mmu
from sglang.srt.managers.mm_utils import (
    get_embedding_chunk,  # keep me
    embedding_cache,
    MultimodalDataItem,
)
'''

# statements whose uses are all simple: planned once per distinct use
SIMPLE = [
    '''
def chunk_{i}(x):
    return mm_utils.get_embedding_chunk(x) + get_embedding_chunk(x, {i})
''',
    '''
def patched_{i}():
    with mock.patch("sglang.srt.managers.mm_utils._get_multimodal_mask"):
        return embedding_cache, MultimodalDataItem
''',
    '''
class Holder{i}:
    """Nothing to see."""

    def method(self, value=1):
        return "caf\u00e9 \u2014 {i}", mmu._is_hip, mmu.PerImageRequestInfo
''',
    '''
def dynamic_{i}(flag):
    getattr(mm_utils, "get_embedding_chunk")
    setattr(mm_utils, "_is_hip", True)
    return mock.patch.object(mm_utils, "get_embedding_and_mask")
''',
    '''
def strings_{i}():
    """Mentions sglang.srt.managers.mm_utils.get_embedding_chunk in prose."""
    return ("sglang.srt.managers.mm_utils.get_embedding_chunk",
            "sglang/srt/managers/mm_utils.py")
''',
    '''
def nested_{i}():
    def inner(rows):
        return [mmu.PerImageRequestInfo for _ in rows]
    return inner, lambda: mm_utils.old_helper
''',
    '''
@mock.patch("sglang.srt.managers.mm_utils._is_hip")
def decorated_{i}(patched, value: mm_utils.PerImageRequestInfo = mmu._is_hip) -> mmu.PerImageRequestInfo:
    return patched, value
''',
    '''
chunk_{i} = mm_utils.get_embedding_chunk, get_embedding_chunk
mock.patch("sglang.srt.managers.mm_utils._get_multimodal_mask").start()
''',
    '''
class Base{i}(mmu.PerImageRequestInfo, metaclass=mm_utils.old_helper):
    pass
''',
    '''
class Body{i}:
    value: mm_utils.PerImageRequestInfo = mm_utils._is_hip

    def method(self, other: mmu.PerImageRequestInfo) -> mm_utils.PerImageRequestInfo:
        return other
''',
    '''
def wrapped_{i}(x):
    with mock.patch(
        "sglang.srt.managers.mm_utils._get_multimodal_mask",
        side_effect=None,
    ):
        return x(
            mm_utils.get_embedding_chunk,
            "sglang.srt.managers."
            "mm_utils.get_embedding_chunk",
        )
''',
    '''
class Computed{i}:
    def method(self, value):
        with mock.patch("sglang.srt.managers.mm_utils._is_hip", new=value, side_effect=lambda *a: self.embedding_cache):
            return self.embedding_cache, getattr(self, "get_embedding_chunk"), setattr(mm_utils, "_is_hip", value)
''',
    '''
def remarked_{i}(x):
    # mm_utils.get_embedding_chunk moved; "sglang.srt.managers.mm_utils" keeps _is_hip
    return x, "# not a comment", mm_utils._is_hip  # embedding_cache
''',
    '''
async def multiple_{i}():
    mock.patch.multiple(mm_utils, get_embedding_chunk=None)
    return importlib.import_module("sglang.srt.managers.mm_utils")
''',
]

# the module object used for a name that stayed: the binding cannot simply be retargeted
STAYED = '''
def stayed_{i}():
    return mm_utils.something_that_stayed
'''

# statements that must go through libcst (each for a reason in ``simple_uses``)
REFUSED = [
    '''
def local_{i}(mm_utils=None):
    return mm_utils.get_embedding_chunk
''',
    '''
def rebinds_{i}():
    global embedding_cache
    embedding_cache = None
''',
    '''
def stores_{i}():
    mm_utils.embedding_cache = {i}
''',
    '''
def split_{i}():
    return (mm_utils
            .get_embedding_chunk)
''',
    '''
def parenthesised_{i}(f):
    return f((mm_utils.get_embedding_chunk), [(embedding_cache)])
''',
    '''
def commented_{i}(f):
    return f(  # the old module
        mm_utils.get_embedding_chunk)
''',
    '''
def keyword_{i}():
    return dict(get_embedding_chunk={i})
''',
    '''
def imports_{i}():
    from sglang.srt.managers.mm_utils import _is_hip
    return _is_hip
''',
    '''
def formatted_{i}():
    return f"{{mm_utils.get_embedding_chunk}}"
''',
    '''
def doctest_{i}():
    """>>> mm_utils.get_embedding_chunk(1)"""
''',
    '''
def shadowed_{i}():
    for embedding_cache in range(2):
        pass
    return embedding_cache, mm_utils.get_embedding_chunk
''',
    '''
def lambda_{i}(f):
    return f(lambda mm_utils: mm_utils.get_embedding_chunk)
''',
    '''
__all__ = ["get_embedding_chunk"]
''',
    '''
def quoted_{i}():
    def inner(value: "mm_utils.PerImageRequestInfo"):
        return value
    return inner
''',
]

# a patch target read through a constant: kept for libcst by ``segments`` (the engine
# reads constants file-wide), whatever the statement's uses look like
CONSTANT_READER = '''
def constant_{i}():
    TARGET = "sglang.srt.managers.mm_utils._is_hip"
    return mock.patch(TARGET)
'''

PLAIN = '''
def plain_{i}(a, b=2):
    return a + b
'''


def _generated(seed: int, statements: int, stayed: bool, newline: str = "\n", indent: str = "    ") -> bytes:
    rng = random.Random(seed)
    parts = [HEADER]
    for i in range(statements):
        roll = rng.random()
        pool = SIMPLE if roll < 0.6 else [*REFUSED, CONSTANT_READER] if roll < 0.8 else [PLAIN]
        parts.append(rng.choice(pool).format(i=i))
        if stayed and i == statements // 2:
            parts.append(STAYED.format(i=i))
    text = "".join(parts).replace("    ", indent)
    return text.replace("\n", newline).encode()


def _fast_statements(reduced) -> int:
    return sum(len(fast) for _, _, fast in reduced.runs)


@pytest.mark.parametrize(("seed", "stayed", "newline", "indent"), [
    (1, False, "\n", "    "), (2, False, "\n", "    "), (3, True, "\n", "    "), (4, True, "\n", "    "),
    (5, False, "\r\n", "    "), (6, True, "\r", "\t"), (7, False, "\n", "\t"),
])
def test_simple_uses_give_what_the_whole_file_pass_gives(move_map, seed, stayed, newline, indent):
    """Generated modules mixing simple statements, refused ones and plain ones, with CRLF,
    lone-CR line ends and tab indentation as well."""
    source = _generated(seed, 150, stayed, newline, indent)
    reduced = reduce(source, move_map)
    assert reduced is not None and _fast_statements(reduced) > 40, "the simple-use path was not taken"
    assert len(reduced.probes) < _fast_statements(reduced), "no use was shared: nothing was copied"
    whole = migrate_source(source, move_map, path="big.py", package="app", segment_above=WHOLE)
    parts = migrate_source(source, move_map, path="big.py", package="app", segment_above=0)
    assert whole.new_source is not None and len(whole.findings) > 100
    assert parts.new_source == whole.new_source
    assert parts.findings == whole.findings


def test_the_probes_do_not_reach_the_output(move_map):
    source = _generated(4, 60, False)
    reduced = reduce(source, move_map)
    assert reduced is not None and reduced.blocks
    outcome = migrate_source(source, move_map, path="big.py", package="app", segment_above=0)
    assert not re.search(rb"_mm_codemod_(probe|sink|kept)_", outcome.new_source)


def _uses(move_map, body: str):
    source = (HEADER + body).encode()
    spans = statement_spans(source)
    watched = watch_words(source, spans, move_map)
    start, end = spans[-1]
    return statement_uses(source[start:end], watched)


@pytest.mark.parametrize("template", REFUSED)
def test_what_is_not_plain_goes_through_libcst(move_map, template):
    assert _uses(move_map, template.format(i=0)) is None


def test_uses_are_located_in_characters_on_their_line(move_map):
    found = _uses(move_map, SIMPLE[2].format(i=0))
    assert found is not None
    uses, masked = found
    texts = [u.text for u in uses]
    assert texts == [b"mmu._is_hip", b"mmu.PerImageRequestInfo"]
    line = SIMPLE[2].format(i=0).lstrip("\n").splitlines()[uses[0].line - 1]
    assert line[uses[0].column :].startswith("mmu._is_hip")  # after two non-ASCII characters
    assert b"mmu" not in masked and b"caf" in masked


def test_a_statement_reading_a_constant_is_left_to_libcst(move_map):
    source = (HEADER + SIMPLE[0].format(i=0) + CONSTANT_READER.format(i=1) + SIMPLE[0].format(i=2)).encode()
    reduced = reduce(source, move_map)
    assert reduced is not None
    fast = [statement.start for _, _, statements in reduced.runs for statement in statements]
    assert len(fast) == 2 and source.index(b"def constant_1") not in fast
    assert b"def constant_1" in reduced.source


@pytest.mark.realworld
def test_simple_uses_on_real_code_with_a_busier_map():
    """Real SGLang 0.5.17 code under a map that moves widely used helpers out of
    ``sglang.srt.utils``: many top-level functions and classes take the simple-use path,
    and every file still comes out exactly as the whole-file pass makes it."""
    from mm_schedule.codemods.movemap.schema import MoveMap

    names = ["add_prefix", "is_cuda", "get_bool_env_var", "is_hip", "is_npu", "_is_cuda", "make_layers",
             "set_weight_attrs", "is_cpu", "get_device_name"]
    move_map = MoveMap.from_dict({
        "header": {}, "old_module": "sglang.srt.utils", "new_module": "sglang.srt.utils_next",
        "moved": {n: {"kind": "function", "private": n.startswith("_")} for n in names},
        "reexported": names[:2], "import_origins": {}, "rebound_globals": [], "removed": [],
        "unmapped_imports": {},
    })
    files = fast = 0
    for name, package, source in release_sources("0.5.17"):
        reduced = reduce(source, move_map) if b"utils" in source else None
        if reduced is None or not _fast_statements(reduced):
            continue
        assert_segmented_pass_matches(source, move_map, name, package)
        files += 1
        fast += _fast_statements(reduced)
        if files == 50:
            break
    assert files == 50 and fast > 80


def test_module_level_uses_are_planned_between_the_statements_libcst_sees(move_map):
    """A use in the module's own scope reads only the bindings made before it: a rebinding
    between two such uses (a statement libcst sees) makes them two shapes."""
    body = "".join(f"value_{i} = mm_utils.get_embedding_chunk\n" for i in range(20))
    source = (HEADER + body + "mm_utils = mmu\n" + body.replace("value_", "later_")
              + "".join(SIMPLE[0].format(i=i) for i in range(10))).encode()
    reduced = reduce(source, move_map)
    assert reduced is not None and _fast_statements(reduced) == 50
    assert sum(1 for nested, _, _ in reduced.probes if not nested) == 2
    whole = migrate_source(source, move_map, path="top.py", package="app", segment_above=WHOLE)
    parts = migrate_source(source, move_map, path="top.py", package="app", segment_above=0)
    assert whole.findings
    assert parts.new_source == whole.new_source
    assert parts.findings == whole.findings


@pytest.mark.parametrize("template", SIMPLE)
def test_plain_statements_take_the_simple_use_path(move_map, template):
    found = _uses(move_map, template.format(i=0))
    assert found is not None and found[0]


def test_comments_are_blanked_but_not_what_strings_hold():
    from mm_schedule.codemods.engine.source_text import without_comments

    text = b"x = 1  # mm_utils\ny = '# no comment'  # two\r\nz = '''a # b\n''' # c\rw = 'unclosed # d"
    blanked = without_comments(text)
    assert len(blanked) == len(text)
    assert b"mm_utils" not in blanked and b"two" not in blanked and b"# c" not in blanked
    assert b"'# no comment'" in blanked and b"'''a # b\n'''" in blanked
    assert blanked.endswith(b"'unclosed # d")  # a string it cannot close stops the blanking


# functions and methods importing the old module themselves (lazy imports): planned as patterns
LOCAL = [
    '''
@mock.patch("sglang.srt.managers.mm_utils._is_hip")
def decorated_local_{i}(patched, value=mm_utils._is_hip) -> mm_utils.PerImageRequestInfo:
    from sglang.srt.managers.mm_utils import get_embedding_chunk
    return patched, get_embedding_chunk, value
''',
    '''
class Lazy{i}(mmu.PerImageRequestInfo):
    """Methods that import the old module when called."""

    cache = mm_utils.embedding_cache

    def method(self, x=get_embedding_chunk):
        from sglang.srt.managers.mm_utils import get_embedding_chunk
        return get_embedding_chunk(x)

    async def other(self):
        import sglang.srt.managers.mm_utils as m
        return m.get_embedding_chunk, get_embedding_chunk, mm_utils.get_embedding_chunk

    def plain(self):
        return get_embedding_chunk
''',
    '''
def lazy_{i}(x):
    from sglang.srt.managers.mm_utils import get_embedding_chunk, something_that_stayed
    return get_embedding_chunk(x, {i}), something_that_stayed
''',
    '''
def aliased_{i}(x):
    """Reads the module through its own alias."""
    import sglang.srt.managers.mm_utils as m
    return m.get_embedding_chunk(x), m._is_hip, mm_utils.get_embedding_chunk
''',
    '''
def later_{i}(x):
    y = x * {i}
    from sglang.srt.managers.mm_utils import get_embedding_chunk as chunk, MultimodalDataItem

    def inner():
        return chunk(y), {{MultimodalDataItem: chunk}}
    return inner
''',
    '''
class Attribute{i}:
    def method(self):
        import sglang.srt.managers.mm_utils as m
        return m.get_embedding_chunk
    later = m.something_that_stayed  # the module-level name, not the method's
''',
    '''
def long_{i}(x):
    from sglang.srt.managers.mm_utils import get_embedding_chunk, get_embedding_and_mask, _is_hip, something_that_stayed
    return get_embedding_chunk(x), get_embedding_and_mask, _is_hip
''',
    '''
async def two_{i}(x):
    import sglang.srt.managers.mm_utils as mmu_local
    value = mmu_local.get_embedding_chunk(x)
    from sglang.srt.managers.mm_utils import _is_hip
    with mock.patch("sglang.srt.managers.mm_utils._get_multimodal_mask"):
        return value if _is_hip else mmu_local.PerImageRequestInfo
''',
]

# functions importing the old module in a way the engine answers with an invented name or
# that the pattern cannot stand for: they go through libcst
LOCAL_REFUSED = [
    '''
def rebound_{i}():
    from sglang.srt.managers.mm_utils import embedding_cache
    return embedding_cache
''',
    '''
def stayed_attribute_{i}():
    import sglang.srt.managers.mm_utils as m
    return m.get_embedding_chunk, m.something_that_stayed
''',
    '''
def module_passed_{i}(f):
    import sglang.srt.managers.mm_utils as m
    return f(m)
''',
    '''
def module_in_call_{i}():
    import sglang.srt.managers.mm_utils as m
    return getattr(m, "get_embedding_chunk")
''',
    '''
def no_alias_{i}():
    import sglang.srt.managers.mm_utils
    return sglang.srt.managers.mm_utils.get_embedding_chunk
''',
    '''
def package_{i}():
    from sglang.srt.managers import mm_utils
    return mm_utils.get_embedding_chunk
''',
    '''
def relative_{i}():
    from .mm_utils import get_embedding_chunk
    return get_embedding_chunk
''',
    '''
def wrapped_import_{i}():
    from sglang.srt.managers.mm_utils import (
        get_embedding_chunk,
    )
    return get_embedding_chunk
''',
    '''
def remarked_import_{i}():
    from sglang.srt.managers.mm_utils import get_embedding_chunk  # lazy
    return get_embedding_chunk
''',
    '''
def semicolon_{i}():
    from sglang.srt.managers.mm_utils import get_embedding_chunk; x = 1
    return get_embedding_chunk, x
''',
    '''
def guarded_{i}():
    try:
        from sglang.srt.managers.mm_utils import get_embedding_chunk
    except ImportError:
        get_embedding_chunk = None
    return get_embedding_chunk
''',
    '''
def twice_{i}(flag):
    from sglang.srt.managers.mm_utils import get_embedding_chunk
    from sglang.srt.managers.mm_utils import get_embedding_chunk
    return get_embedding_chunk
''',
    '''
def rebinds_local_{i}():
    from sglang.srt.managers.mm_utils import get_embedding_chunk
    get_embedding_chunk = None
    return get_embedding_chunk
''',
    '''
def inner_import_{i}():
    def inner():
        from sglang.srt.managers.mm_utils import get_embedding_chunk
        return get_embedding_chunk
    return inner
''',
]


def _local_uses(move_map, body: str):
    from mm_schedule.codemods.fastpath.simple_uses import LocalImports

    source = (HEADER + body).encode()
    spans = statement_spans(source)
    start, end = spans[-1]
    return statement_uses(source[start:end], watch_words(source, spans, move_map), LocalImports.for_map(move_map))


@pytest.mark.parametrize("template", LOCAL)
def test_functions_importing_the_old_module_are_patterns(move_map, template):
    found = _local_uses(move_map, template.format(i=0))
    assert found is not None
    kinds = [use.kind for use in found[0]]
    assert "import" in kinds and "arg" in kinds
    assert [use.start for use in found[0]] == sorted(use.start for use in found[0])


@pytest.mark.parametrize("template", LOCAL_REFUSED)
def test_local_imports_the_pattern_cannot_stand_for_go_through_libcst(move_map, template):
    assert _local_uses(move_map, template.format(i=0)) is None


def _local_generated(seed: int, statements: int, newline: str = "\n", indent: str = "    ") -> bytes:
    rng = random.Random(seed)
    parts = [HEADER]
    for i in range(statements):
        roll = rng.random()
        pool = LOCAL if roll < 0.6 else LOCAL_REFUSED if roll < 0.75 else SIMPLE if roll < 0.9 else [PLAIN]
        parts.append(rng.choice(pool).format(i=i))
    # libcst drops the lone CR that ends a file, so a module ending in a marker line falls
    # back to the whole file: end on a statement libcst sees
    parts.append(LOCAL_REFUSED[0].format(i=statements))
    return "".join(parts).replace("    ", indent).replace("\n", newline).encode()


def _reduced_outcome(source: bytes, move_map):
    """The reduced module's migration mapped back, without the whole-file fallback."""
    from mm_schedule.codemods.engine.transform import _libcst_pass

    reduced = reduce(source, move_map)
    assert reduced is not None
    new_source, findings = _libcst_pass(reduced.source, move_map, "big.py", "app", reduced.skipped_words)
    return reduced, reduced.finish(new_source, findings)


@pytest.mark.parametrize(("seed", "newline", "indent"), [
    (11, "\n", "    "), (12, "\n", "    "), (13, "\r\n", "    "), (14, "\r", "\t"), (15, "\n", "\t"),
    (16, "\n", "  "),
])
def test_local_import_patterns_give_what_the_whole_file_pass_gives(move_map, seed, newline, indent):
    """Generated modules mixing lazy-import functions with ones that must go through
    libcst, simple statements and plain ones: the reduced pass itself (no fallback)
    matches the whole file byte for byte and finding for finding."""
    source = _local_generated(seed, 120, newline, indent)
    reduced, finished = _reduced_outcome(source, move_map)
    patterns = [s for _, _, fast in reduced.runs for s in fast if any(u.kind == "import" for u in s.uses)]
    assert len(patterns) > 40, "the pattern path was not taken"
    assert sum(1 for _, kind, _ in reduced.probes if kind == "local") < len(patterns) / 5, "patterns were not shared"
    whole = migrate_source(source, move_map, path="big.py", package="app", segment_above=WHOLE)
    assert whole.new_source is not None and len(whole.findings) > 100
    assert finished is not None, "the reduced pass fell back to the whole file"
    assert finished == (whole.new_source, whole.findings)
    assert not re.search(rb"_mm_codemod_(probe|sink|kept|gap)_", finished[0])
    # a rewritten import too long for its line is wrapped, continuation lines indented from the body
    assert (indent + "from sglang.srt.managers.mm_schedule import (" + newline + indent + "    get_embedding_chunk,").encode() in finished[0]


def test_a_pattern_whose_rewrite_binds_a_new_name_falls_back(move_map, monkeypatch):
    """The safety net behind the refusals: were a from-import of a rebound global let
    through, the engine would bind a module alias in the probe (numbered file-wide), so
    the reduced pass gives up and the whole file is processed instead."""
    from mm_schedule.codemods.fastpath import simple_uses

    let_through = simple_uses.LocalImports(move_map.old_module, frozenset(move_map.moved), frozenset())
    monkeypatch.setattr(simple_uses.LocalImports, "for_map", classmethod(lambda cls, _map: let_through))
    source = (HEADER + "".join(LOCAL_REFUSED[0].format(i=i) for i in range(5))
              + "".join(LOCAL[0].format(i=i) for i in range(5, 10))).encode()
    reduced, finished = _reduced_outcome(source, move_map)
    assert any(kind == "local" and b"embedding_cache" in b"".join(t for _, t in text[1])
               for _, kind, text in reduced.probes)
    assert finished is None
    whole = migrate_source(source, move_map, path="big.py", package="app", segment_above=WHOLE)
    assert migrate_source(source, move_map, path="big.py", package="app", segment_above=0) == whole
    assert b"mm_schedule_1" in whole.new_source  # the numbered alias one probe could not stand for


def test_uses_out_of_source_order_in_the_tree_are_rewritten_in_place(move_map):
    """``ast`` visits a dict's keys before its values and a conditional's test before
    its body: the uses are still copied back at their own places."""
    body = "".join(f'''
def mixed_{i}(flag):
    return {{mm_utils.get_embedding_chunk: mm_utils._is_hip, mm_utils.PerImageRequestInfo: flag}}, (
        mm_utils.get_embedding_chunk if mm_utils._is_hip else flag)
''' for i in range(20))
    source = (HEADER + body).encode()
    reduced, finished = _reduced_outcome(source, move_map)
    assert _fast_statements(reduced) == 20
    whole = migrate_source(source, move_map, path="big.py", package="app", segment_above=WHOLE)
    assert finished == (whole.new_source, whole.findings)


def test_each_method_that_imports_is_a_pattern_of_its_own(move_map):
    """In a class, every method importing the old module is one pattern; what else the
    class holds (its bases, attributes, other methods) stays simple uses shared file-wide."""
    lazy = next(t for t in LOCAL if t.lstrip().startswith("class Lazy"))
    source = (HEADER + "".join(lazy.format(i=i) for i in range(30)) + LOCAL_REFUSED[0].format(i=30)).encode()
    reduced, finished = _reduced_outcome(source, move_map)
    assert _fast_statements(reduced) == 30
    assert [kind for _, kind, _ in reduced.probes].count("local") == 2
    statement = next(fast[0] for _, _, fast in reduced.runs if fast)
    in_patterns = [use.pattern for use in statement.uses if use.pattern >= 0]
    assert sorted(set(in_patterns)) == [0, 1] and len(in_patterns) < len(statement.uses)
    whole = migrate_source(source, move_map, path="big.py", package="app", segment_above=WHOLE)
    assert finished == (whole.new_source, whole.findings)
