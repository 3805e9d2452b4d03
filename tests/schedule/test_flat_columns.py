"""The flat planner's pass over the items, in C (``_flat_columns.c``) and in Python
(``flat_columns_py``): on the same inputs both must build the same columns, give up on
the same steps and raise the same exceptions; and a plan must not depend on which one
ran. Inputs are drawn fresh (seeded) and include every malformed shape the pass checks."""

from __future__ import annotations

import collections
import enum
import gc
import itertools
import random
import re
import shutil
import sys
import sysconfig

import pytest
import torch

from mm_schedule import MMItem
from mm_schedule.items import KNOWN_MODALITIES, modality_name
from mm_schedule.keys import item_key
from mm_schedule.plan import flat, plan_columns
from mm_schedule.plan.general import plan_general

C_PASS = flat._flat_columns_c


class Modality(enum.Enum):
    IMAGE = 1
    AUDIO = 2


def c_columns(*args):
    return C_PASS(*args, KNOWN_MODALITIES, modality_name, item_key)


def _needs_c_pass():
    if C_PASS is None:
        pytest.skip("the C pass is not built in this install")


def test_c_pass_is_built_where_a_compiler_is():
    """An install on a machine with a C compiler has the pass: if it is missing there, its
    build broke and the Python fallback would hide that."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if C_PASS is None and shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on this machine")
    assert C_PASS is not None


SPELLINGS = {"IMAGE": ["IMAGE", "image", Modality.IMAGE], "AUDIO": ["AUDIO", "audio", Modality.AUDIO]}


def _span(rng, start, end):
    return (start, end) if rng.random() < 0.7 else [start, end]


def random_step(rng: random.Random, *, odd_inputs: bool):
    """``(item_lists, prefixes, extends, offsets, row_offsets)``; with ``odd_inputs`` some
    fields are malformed or outside the flat shape (the general planner's business)."""
    item_lists, prefixes, extends, offsets, row_offsets = [], [], [], [], []
    modality_of: dict = {}
    base = 0
    for r in range(rng.randint(1, 6)):
        pos, items = rng.randint(0, 3), []
        for _ in range(rng.randint(0, 5)):
            length = rng.randint(1, 6)
            h = rng.choice([rng.randint(1, 6), 100 * r + len(items) + 10, f"img-{rng.randint(0, 3)}",
                            bytes([rng.randint(0, 3)])])
            # One hash, one modality (a content hash covers what the item is), spelt any way.
            kind = modality_of.setdefault(h, rng.choice(["IMAGE", "AUDIO"]))
            modality = rng.choice(SPELLINGS[kind])
            items.append(MMItem(hash=h, modality=modality, offsets=[_span(rng, pos, pos + length - 1)],
                                feature=torch.zeros(1)))
            pos += length + rng.randint(0, 2)
        prefix, extend = rng.randint(0, 8), rng.randint(-1, 12)
        # The item's own span object (as SGLang's flattened offsets hold it) or an equal copy.
        given = [rng.choice([it.offsets[0], tuple(list(it.offsets[0]))]) for it in items] \
            if rng.random() < 0.5 else None
        row = None if rng.random() < 0.6 else base + rng.randint(0, 3)
        base += max(extend, 0) + 3
        if odd_inputs and items and rng.random() < 0.5:
            victim = rng.randrange(len(items))
            it = items[victim]
            s, e = it.offsets[0]
            kind = rng.randrange(12)
            if kind == 0:
                it.precomputed_embeddings = torch.zeros(e - s + 1, 2)
            elif kind == 1:
                it.offsets = [(s, e), (e + 50, e + 52)]  # two spans
            elif kind == 2:
                it.offsets = (s, e)  # a bare pair
            elif kind == 3:
                it.offsets = [(float(s), e)]
            elif kind == 4:
                it.offsets = [(e, s - 1)] if s > 0 else [(s, s - 1)]
            elif kind == 5 and victim:
                items[victim - 1], items[victim] = items[victim], items[victim - 1]  # out of order
            elif kind == 6 and given is not None:
                given[victim] = (s, e + 1)
            elif kind == 7 and given is not None:
                given = given[:-1]
            elif kind == 8:
                it.hash = 2.5  # not a hash type
            elif kind == 9:
                prefix = True
            elif kind == 10:
                it.offsets = [(s, e, 0)]
            elif kind == 11:
                row = -1.0
        if odd_inputs and rng.random() < 0.05:
            prefix = -1
        item_lists.append(items if rng.random() < 0.8 else tuple(items))
        prefixes.append(prefix)
        extends.append(extend)
        offsets.append(given)
        row_offsets.append(row)
    return item_lists, prefixes, extends, offsets, row_offsets


def _same_columns(c, py):
    assert (c is None) == (py is None), (c, py)
    if c is None:
        return
    keys, rows, requests, modalities, first_items, seg_token_row, seg_request, odd, n_tokens = c
    assert (keys, rows, requests, modalities, seg_token_row, seg_request, n_tokens) == (
        py[0], py[1], py[2], py[3], py[5], py[6], py[8])
    # Items are the caller's own objects: the same ones, not equal copies.
    assert len(first_items) == len(py[4]) and all(a is b for a, b in zip(first_items, py[4]))
    assert len(odd) == len(py[7])
    for got, want in zip(odd, py[7]):
        assert got[:4] == want[:4] and got[4] is want[4] and got[5] is want[5]
    for column in (keys, rows, requests, modalities, first_items, seg_token_row, seg_request, odd):
        assert type(column) is list


@pytest.mark.parametrize("odd_inputs", [False, True], ids=["flat-shape", "malformed"])
def test_c_and_python_passes_build_the_same_columns(odd_inputs):
    _needs_c_pass()
    rng = random.Random(f"flat columns {odd_inputs} {random.getrandbits(32)}")
    outcomes = {"columns": 0, "gave up": 0}
    for _ in range(400):
        step = random_step(rng, odd_inputs=odd_inputs)
        c, py = c_columns(*step), flat.flat_columns_py(*step)
        _same_columns(c, py)
        outcomes["gave up" if c is None else "columns"] += 1
    assert outcomes["columns"] > 50
    if odd_inputs:
        assert outcomes["gave up"] > 50


def _flattened(step, rng):
    """``step`` with its item lists as one flat list and request bounds (SGLang's
    ``embedding_items`` / ``items_size``), sometimes with bounds past the list's end
    (which slicing shortens)."""
    item_lists, *rest = step
    flat_items, bounds = [], [0]
    for items in item_lists:
        flat_items += list(items)
        bounds.append(len(flat_items))
    if rng.random() < 0.1 and len(bounds) > 1:
        del flat_items[-1:]  # the last request's slice comes out one short
    return flat_items, rest, bounds


@pytest.mark.parametrize("odd_inputs", [False, True], ids=["flat-shape", "malformed"])
def test_flat_item_list_with_bounds_is_planned_as_its_slices(odd_inputs):
    """One flat item list with request bounds gives exactly the columns (or give-up, or
    exception) of the per-request slices, in both passes."""
    _needs_c_pass()
    rng = random.Random(f"flat bounds {odd_inputs} {random.getrandbits(32)}")
    planned = 0
    for _ in range(300):
        step = random_step(rng, odd_inputs=odd_inputs)
        flat_items, rest, bounds = _flattened(step, rng)
        slices = [flat_items[a:b] for a, b in itertools.pairwise(bounds)]
        runs = ((c_columns, (slices, *rest)),
                (C_PASS, (flat_items, *rest, KNOWN_MODALITIES, modality_name, item_key, bounds)),
                (flat.flat_columns_py, (flat_items, *rest, bounds)))
        outcomes = []
        for run, args in runs:
            try:
                outcomes.append(run(*args))
            except Exception as exc:  # compared across the three runs
                outcomes.append((type(exc), str(exc)))
        for other in outcomes[1:]:
            if isinstance(other, tuple) and len(other) == 2 and isinstance(other[0], type):
                assert other == outcomes[0]
            else:
                _same_columns(other, outcomes[0])
        planned += outcomes[0] is not None and not isinstance(outcomes[0][0], type)
    assert planned > 30


def test_bounds_that_are_not_plain_ints_give_up_to_the_general_planner():
    _needs_c_pass()
    items = [MMItem(hash=1, offsets=[(0, 1)]), MMItem(hash=2, offsets=[(3, 4)])]
    columns = ([0, 0], [5, 5], [None, None], [None, None])  # prefixes, extends, offsets, row offsets
    for bounds in ([0, 1, -1], [0, 1.0, 2], [0, True, 2]):
        assert C_PASS(items, *columns, KNOWN_MODALITIES, modality_name, item_key, bounds) is None
        assert flat.flat_columns_py(items, *columns, bounds) is None
    # The general planner then slices with Python's rules: [0:1] and [1:-1] (empty).
    plan = plan_columns(items, *columns, None, None, bounds=[0, 1, -1])
    assert plan.keys == [1] and plan.requests == [0]
    plan = plan_columns(items, *columns, None, None, bounds=[0, 1, 2])
    assert plan.keys == [1, 2] and plan.requests == [0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_plan_does_not_depend_on_which_pass_ran(monkeypatch, seed):
    """Whole plans, C pass against Python pass and against the general planner, on steps
    with cut items, repeated hashes and row offsets."""
    _needs_c_pass()
    rng = random.Random(f"flat plans {seed} {random.getrandbits(32)}")
    columns = ("kinds", "keys", "rows", "requests", "modalities", "seg_source", "seg_src_row", "seg_rows",
               "seg_packed_row", "seg_token_row", "seg_request", "encoder_batches", "n_rows", "n_tokens")
    mixed = 0
    compared = 0
    for _ in range(150):
        step = random_step(rng, odd_inputs=False)
        with_c = flat.plan_flat(*step, 7)
        monkeypatch.setattr(flat, "_flat_columns_c", None)
        with_py = flat.plan_flat(*step, 7)
        monkeypatch.setattr(flat, "_flat_columns_c", C_PASS)
        if with_c is None:
            assert with_py is None
            continue
        with_c, with_py = with_c.with_lookups(None), with_py.with_lookups(None)
        for name in columns:
            assert _plain(getattr(with_c, name)) == _plain(getattr(with_py, name)), name
        # The general planner numbers a request's sources modality group by modality group,
        # the flat one in position order: the same plan up to that numbering.
        general = plan_general(*step, 7).with_lookups(None)
        assert _by_key(with_c) == _by_key(general)
        mixed += len(set(with_c.modalities)) > 1
        compared += 1
    assert compared > 60 and mixed > 10


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def _by_key(plan):
    """A plan with sources named by key: each segment's (key, src_row, n_rows, packed row,
    token row, request), each source's (key, rows, first request, modality), and the
    encoder calls as key tuples per modality in call order."""
    keys = plan.keys
    segments = list(zip(map(keys.__getitem__, plan.seg_source), plan.seg_src_row, plan.seg_rows,
                        plan.seg_packed_row, plan.seg_token_row, plan.seg_request))
    sources = sorted(zip(keys, plan.rows, plan.requests, plan.modalities))
    calls: dict[str, list] = {}
    for modality, batch in plan.encoder_batches:
        calls.setdefault(modality, []).append(tuple(keys[s] for s in batch))
    return segments, sources, calls, plan.n_rows, plan.n_tokens


@pytest.mark.parametrize("value", [2**60 + 1, -(2**61), 2**64])
def test_integers_beyond_the_c_range_go_to_the_general_planner(value):
    """The C pass works on int64 within 2**60 and leaves larger values to the general
    planner, which plans them exactly (no narrowing, no overflow)."""
    _needs_c_pass()
    items = [MMItem(hash=5, offsets=[(value, value + 3)], feature=torch.zeros(1))]
    step = ([items], [value], [8], [None], [None])
    assert c_columns(*step) is None
    if value >= 0:
        plan = plan_columns(*step, None, None)
        assert list(plan.seg_token_row) == [0] and list(plan.rows) == [4] and plan.n_rows == 4
    assert c_columns([[]], [0], [value], [None], [None]) is None  # a large extend alone is enough


class _Raising:
    """An item whose ``hash`` attribute raises ``error``."""

    def __init__(self, error):
        self.error = error
        self.offsets = [(0, 1)]
        self.precomputed_embeddings = None
        self.modality = "IMAGE"

    @property
    def hash(self):
        raise self.error


@pytest.mark.parametrize("error", [AttributeError("no hash"), TypeError("bad"), ValueError("bad")])
def test_lookup_errors_of_the_flat_shape_give_up_in_both(error):
    _needs_c_pass()
    step = ([[_Raising(error)]], [0], [4], [None], [None])
    assert c_columns(*step) is None and flat.flat_columns_py(*step) is None


def test_other_exceptions_propagate_from_both():
    _needs_c_pass()
    step = ([[_Raising(RuntimeError("item store closed"))]], [0], [4], [None], [None])
    with pytest.raises(RuntimeError, match="item store closed"):
        c_columns(*step)
    with pytest.raises(RuntimeError, match="item store closed"):
        flat.flat_columns_py(*step)


def test_unhashable_and_odd_modalities_agree():
    _needs_c_pass()
    for modality in ([1], {"a": 1}, None, 3.5, Modality.AUDIO):
        items = [MMItem(hash=1, modality=modality, offsets=[(0, 2)], feature=torch.zeros(1))]
        step = ([items], [0], [4], [None], [None])
        _same_columns(c_columns(*step), flat.flat_columns_py(*step))


def test_the_c_pass_holds_no_reference_it_does_not_return():
    """Run many times over one set of inputs: the refcounts of the inputs' objects (items,
    hashes, spans, the step's lists) are the same before and after, and no object is
    left behind."""
    _needs_c_pass()
    rng = random.Random("refcounts")
    steps = [random_step(rng, odd_inputs=odd) for odd in (False, True) * 20]
    watched = []
    for step in steps:
        for items in step[0]:
            for it in items:
                watched += [it, it.hash, it.offsets, it.modality]
        watched += list(step)
    for step in steps:  # first calls fill the modality-name table; later ones add nothing
        c_columns(*step)
    # Objects shared with the rest of the interpreter (small ints, None, interned names)
    # change counts for reasons of their own: watched are the step's own objects.
    watched = [obj for obj in watched if sys.getrefcount(obj) < 1000]
    assert len(watched) > 200
    gc.collect()
    before = [sys.getrefcount(obj) for obj in watched]
    count_before = len(gc.get_objects())
    for _ in range(50):
        for step in steps:
            c_columns(*step)
    gc.collect()
    assert [sys.getrefcount(obj) for obj in watched] == before
    assert len(gc.get_objects()) <= count_before + 10


def test_wrong_arguments_are_refused():
    _needs_c_pass()
    with pytest.raises(TypeError, match="takes 8 or 9 arguments, got 2"):
        C_PASS([], [])
    with pytest.raises(TypeError, match="with bounds, item_lists and bounds must be lists"):
        C_PASS([], [], [], [], [], {}, modality_name, item_key, (0,))
    with pytest.raises(TypeError, match="names must be a dict"):
        C_PASS([], [], [], [], [], [], modality_name, item_key)


_MUTATING_NE = r"""
import sys
from mm_schedule import MMItem
from mm_schedule.items import KNOWN_MODALITIES, modality_name
from mm_schedule.keys import item_key
from mm_schedule.plan import flat
import torch

class Replacing(int):
    # Equal to the span's start; comparing it replaces the item's span (freeing the old
    # one and its ends, which nothing else holds).
    def __ne__(self, other):
        item.offsets[0] = (int("2000"), int("2003"))
        return int(self) != other

def step():
    global item
    item = MMItem(hash=5, offsets=[(int("1000"), int("1003"))], feature=torch.zeros(1))
    return [[item]], [990], [20], [[(Replacing(1000), int("1003"))]], [None]

runs = [flat._flat_columns_c(*step(), KNOWN_MODALITIES, modality_name, item_key) for _ in range(200)]
py = flat.flat_columns_py(*step())
for got in runs:
    assert got is not None and got[:4] == py[:4] and got[5:7] == py[5:7] and got[8] == py[8], (got, py)
print("ok", py[1], py[5])
"""


def test_a_span_replaced_while_its_given_span_is_compared(tmp_path):
    """A given span whose ``__ne__`` replaces the item's span: the C pass reads the ends it
    copied before the comparison, never the freed ones (checked with the debug allocator,
    which poisons freed memory), and plans what the Python pass plans."""
    _needs_c_pass()
    import os
    import subprocess

    script = tmp_path / "mutating_ne.py"
    script.write_text(_MUTATING_NE)
    env = {**os.environ, "PYTHONMALLOC": "debug"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ok", "[4]", "[10]"]


def _two_spans(first, second, prefix=0, extend=40):
    items = [MMItem(hash=1, offsets=[first], feature=torch.zeros(1)),
             MMItem(hash=2, offsets=[second], feature=torch.zeros(1))]
    return [items], [prefix], [extend], [None], [None]


def _general_outcome(step):
    try:
        plan = plan_general(*step, 7)
    except Exception as exc:  # the outcome compared is the exception itself
        return type(exc), str(exc)
    return plan.n_rows, list(plan.rows)


@pytest.mark.parametrize(("first", "second", "flat_shape", "rows"), [
    ((0, 3), (3, 5), False, None),  # touching: position 3 claimed twice
    ((0, 3), (4, 5), True, 6),      # adjacent, one past the boundary
    ((0, 3), (2, 5), False, None),  # overlapping
    ((0, 3), (0, 3), False, None),  # the same span twice
    ((4, 6), (0, 3), False, 7),     # out of order: the general planner's shape, planned
    ((4, 6), (0, 4), False, None),  # out of order and overlapping
    ((0, 3), (5, 4), False, None),  # an end before its start
    ((0, 3), (5, 5), True, 5),      # a one-token span
])
def test_touching_and_overlapping_spans_are_refused_by_both_passes(first, second, flat_shape, rows):
    """Both sides of the ordering boundaries: the C and Python passes take or leave the
    step alike, and the step's outcome (a plan of one row per position, or the general
    planner's error) is the same whichever pass ran."""
    _needs_c_pass()
    step = _two_spans(first, second)
    c, py = c_columns(*step), flat.flat_columns_py(*step)
    _same_columns(c, py)
    assert (c is not None) == flat_shape
    if flat_shape:
        assert sum(c[1]) == rows
    general = _general_outcome(step)
    if rows is None:
        assert isinstance(general[0], type) and issubclass(general[0], ValueError), general
        with pytest.raises(general[0], match=re.escape(general[1])):
            plan_columns(*step, None, None)
    else:
        assert general[0] == rows and plan_columns(*step, None, None).n_rows == rows


def test_window_boundaries_agree_on_both_sides():
    """An item at positions 5..8 against every window edge just before, on and just
    after it: both passes plan the positions inside the window, one row each."""
    _needs_c_pass()
    for prefix in range(0, 11):
        for extend in range(1, 12):
            step = _two_spans((5, 8), (12, 13), prefix=prefix, extend=extend)
            c, py = c_columns(*step), flat.flat_columns_py(*step)
            _same_columns(c, py)
            inside = sum(prefix <= p < prefix + extend for p in (*range(5, 9), 12, 13))
            assert plan_columns(*step, None, None).n_rows == inside, (prefix, extend)


class _BoundsChanger(MMItem):
    """An item whose ``offsets`` getter changes the step's request bounds (and the item
    list) the first time it is read: both passes must plan the bounds as given."""

    def __init__(self, *args, bounds=None, flat_items=None, change=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._spans = kwargs.get("offsets")
        self._change = (bounds, flat_items, change)

    @property
    def offsets(self):
        bounds, flat_items, change = getattr(self, "_change", (None, None, None))
        if change is not None:
            self._change = (None, None, None)
            change(bounds, flat_items)
        return self._spans

    @offsets.setter
    def offsets(self, value):
        self._spans = value


@pytest.mark.parametrize("change", ["shrink", "grow", "bad bound", "clear items"])
def test_bounds_and_items_changed_by_users_code_mid_pass_are_planned_as_given(change):
    """An item's property that edits ``items_size`` or ``embedding_items`` while the step is
    planned: the C pass reads both as they were when it was called, as the Python pass
    (which slices everything up front) does."""
    _needs_c_pass()
    edits = {
        "shrink": lambda bounds, items: bounds.__setitem__(2, 2),
        "grow": lambda bounds, items: bounds.append(9),
        "bad bound": lambda bounds, items: bounds.__setitem__(3, -1),
        "clear items": lambda bounds, items: items.clear(),
    }

    def step():
        items = [MMItem(hash=10 + k, offsets=[(0, 1)]) for k in range(3)]
        bounds = [0, 1, 3, 3]
        items[1:3] = [MMItem(hash=11, offsets=[(0, 1)]), MMItem(hash=12, offsets=[(3, 4)])]
        items[0] = _BoundsChanger(hash=10, offsets=[(0, 1)], bounds=bounds, flat_items=items, change=edits[change])
        return items, [0, 0, 0], [5, 5, 5], [None] * 3, [None] * 3, bounds

    items, *columns, bounds = step()
    c = C_PASS(items, *columns, KNOWN_MODALITIES, modality_name, item_key, bounds)
    items, *columns, bounds = step()  # the same step afresh (the edit happens once)
    py = flat.flat_columns_py(items, *columns, bounds)
    assert c is not None and py is not None
    assert [c[i] for i in (0, 1, 2, 3, 5, 6, 8)] == [py[i] for i in (0, 1, 2, 3, 5, 6, 8)]
    assert [it.hash for it in c[4]] == [it.hash for it in py[4]] and c[7] == py[7] == []
    assert c[0] == [10, 11, 12] and c[2] == [0, 1, 1]


def test_spans_that_are_pairs_of_other_types_give_up_in_both_passes():
    """A span (or a request-level span) given as a namedtuple, a list subclass or a range
    is a pair to Python's unpacking but not to the C pass's exact reads: both give up, and
    the general planner plans it."""
    _needs_c_pass()
    pair = collections.namedtuple("pair", "start end")

    class Span(list):
        pass

    for odd in (pair(0, 1), Span([0, 1]), range(0, 2)):
        for offsets, given in (([odd], None), ([(0, 1)], [odd])):
            step = ([[MMItem(hash=5, offsets=offsets)]], [0], [4], [given], [None])
            assert c_columns(*step) is None and flat.flat_columns_py(*step) is None, (odd, given)
            plan = plan_columns(*step, None, None)
            assert plan.keys == [5] and plan.n_rows == 2
