"""The move-map data format: loading, validation, canonical text, look-ups."""

from __future__ import annotations

import json
import random
import string

import pytest

from mm_schedule.codemods.movemap.schema import KINDS, MovedName, MoveMap, load_map
from mm_schedule.errors import MoveMapError


def _random_name(rng: random.Random) -> str:
    head = rng.choice(["", "_"]) + rng.choice(string.ascii_letters)
    return head + "".join(rng.choices(string.ascii_letters + string.digits + "_", k=rng.randint(0, 10)))


def _random_map(rng: random.Random) -> MoveMap:
    names = list({_random_name(rng) for _ in range(rng.randint(1, 30))})
    rng.shuffle(names)
    cut = rng.randint(0, len(names))
    moved = {n: MovedName(kind=rng.choice(KINDS), private=n.startswith("_")) for n in names[:cut]}
    origins = {n: rng.choice(["typing", "a.b", "pkg.sub.mod"]) for n in names[cut:]}
    return MoveMap(
        old_module="pkg.old",
        new_module="pkg.new",
        moved=moved,
        reexported=frozenset(rng.sample(sorted(moved), k=rng.randint(0, len(moved)))),
        import_origins=origins,
        rebound_globals=frozenset(rng.sample(sorted(moved), k=min(2, len(moved)))),
        header={"command": "x"},
        removed=frozenset({"gone_" + str(rng.randint(0, 9))}),
        unmapped_imports={"np": "import numpy as np"} if rng.random() < 0.5 else {},
    )


@pytest.mark.parametrize("seed", range(8))
def test_round_trip_and_canonical_text_ignore_insertion_order(seed):
    rng = random.Random(seed)
    original = _random_map(rng)
    text = original.to_json()
    loaded = MoveMap.from_dict(json.loads(text))
    assert loaded == original
    assert loaded.header == original.header
    # The same content inserted in another order gives byte-identical text.
    shuffled_items = list(original.moved.items())
    rng.shuffle(shuffled_items)
    reordered = MoveMap.from_dict({**json.loads(text), "moved": {
        k: {"kind": v.kind, "private": v.private} for k, v in shuffled_items}})
    assert reordered.to_json() == text
    assert list(json.loads(text)["moved"]) == sorted(original.moved)


def test_header_is_not_part_of_equality():
    rng = random.Random(99)
    a = _random_map(rng)
    b = MoveMap.from_dict({**a.to_dict(), "header": {"command": "something else"}})
    assert a == b
    c = MoveMap.from_dict({**a.to_dict(), "removed": [*sorted(a.removed), "another"]})
    assert a != c


def test_destination():
    m = MoveMap(
        old_module="o", new_module="n",
        moved={"f": MovedName("function", False), "_g": MovedName("function", True)},
        reexported=frozenset({"f"}), import_origins={"Item": "pkg.items"},
        rebound_globals=frozenset(),
    )
    assert m.destination("f") == "n"
    assert m.destination("_g") == "n"
    assert m.destination("Item") == "pkg.items"
    assert m.destination("stays") is None


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"moved": {"f": {"kind": "method", "private": False}}}, "moved name 'f'.*kind='method'"),
        ({"moved": {"f": {"kind": "function", "private": "no"}}}, "moved name 'f'.*boolean 'private'"),
        ({"reexported": ["not_moved"]}, "not_moved"),
        ({"import_origins": {"f": "x"}}, "both as moved and as import_origins: \\['f'\\]"),
        ({"removed": ["f"]}, "both as moved and as removed"),
        ({"moved": {"f": {"kind": "function"}}}, "moved\\['f'\\]: expected"),
        ({"moved": ["f"]}, "moved: expected a dict, got list"),
        ({"new_module": "o"}, "new_module is the same as old_module"),
        ({"new_module": "pkg..mod"}, "new_module: 'pkg..mod' is not a dotted module name"),
        ({"old_module": "pkg.mod-x"}, "old_module: 'pkg.mod-x' is not a dotted module name"),
        ({"new_module": 3}, "new_module: expected a str, got int"),
        ({"import_origins": {"g": "o"}}, "import_origins\\['g'\\] is the old module itself"),
        ({"import_origins": {"g": "a b"}}, "import_origins\\['g'\\]: 'a b' is not a dotted"),
        ({"removed": ["bad name"]}, "removed: 'bad name' is not a Python name"),
        ({"removed": "f"}, "removed: expected a list, got str"),
        ({"removed": ["g", "g"]}, "removed: lists an entry twice"),
        ({"rebound_globals": [1]}, "rebound_globals: expected a list of strings"),
        ({"unmapped_imports": {"np": 1}}, "unmapped_imports\\['np'\\]: expected a string"),
        ({"surprise": 1}, "unknown keys \\['surprise'\\]"),
        ({"looked_up_in": {"f": ["o"]}}, "looked_up_in lists names that are not re-exported"),
    ],
)
def test_invalid_maps_raise_typed_errors(patch, needle):
    base = {"old_module": "o", "new_module": "n", "moved": {"f": {"kind": "function", "private": False}}}
    with pytest.raises(MoveMapError, match=needle) as info:
        MoveMap.from_dict({**base, **patch})
    assert isinstance(info.value, ValueError)


def test_duplicate_keys_in_a_map_file_are_refused(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"old_module": "o", "new_module": "n", "moved": {"f": {"kind": "function", '
                    '"private": false}, "f": {"kind": "class", "private": false}}}')
    with pytest.raises(MoveMapError, match=r"dup\.json: key 'f' appears twice"):
        load_map(path)


def test_target_version_reports_names_lost_before_the_maps_range():
    data = {"old_module": "o", "new_module": "n", "moved": {}, "earlier": {"gone": "last in 0.4.6"},
            "header": {"split_version": "0.5.18", "distribution": "sglang"}}
    m = MoveMap.from_dict(data)
    assert "gone" not in m.removed and "gone" not in m.interesting
    targeted = m.for_target("0.5.18")
    assert "gone" in targeted.removed and "gone" in targeted.interesting
    with pytest.raises(MoveMapError, match=r"covers sglang 0\.5\.18 only, not 0\.5\.19"):
        m.for_target("0.5.19")


# Four releases: "b" left the old module in r2; the split is r3 ("f" moves, "g" stays
# re-exported); r4 drops "f" from the new module again and brings "b" back.
LIFETIMES = {
    "header": {"distribution": "dist"},
    "old_module": "o", "new_module": "n",
    "moved": {"f": {"kind": "function", "private": False}, "g": {"kind": "function", "private": False},
              "h": {"kind": "function", "private": False}},
    "reexported": ["g"],
    "import_origins": {"t": "typing"},
    "releases": ["r1", "r2", "r3", "r4"],
    "lifetimes": {
        "old_module": {"f": [["r1", "r2"]], "g": [["r1", "r4"]], "h": [["r2", "r2"]],
                       "b": [["r1", "r1"], ["r4", "r4"]], "t": [["r1", "r2"]]},
        "new_module": {"f": [["r3", "r3"]], "g": [["r3", "r4"]], "h": [["r3", "r4"]]},
    },
}


@pytest.mark.parametrize(("release", "moved", "reexported", "removed", "origins"), [
    ("r1", set(), set(), set(), {}),  # before the split: only names already gone count
    ("r2", set(), set(), {"b"}, {}),
    ("r3", {"f", "g", "h"}, {"g"}, {"b"}, {"t": "typing"}),
    ("r4", {"g", "h"}, {"g"}, {"f"}, {"t": "typing"}),  # "b" is back; "f" left the new module
])
def test_a_map_aims_at_any_release_it_covers(release, moved, reexported, removed, origins):
    m = MoveMap.from_dict(LIFETIMES).for_target(release)
    assert (set(m.moved), set(m.reexported), set(m.removed), m.import_origins) == (
        moved, reexported, removed, origins)
    assert set(m.earlier) == removed


def test_the_note_names_the_last_release_that_had_the_name():
    assert MoveMap.from_dict(LIFETIMES).for_target("r3").earlier == {
        "b": "last in dist r1 (gone since r2)"}
    assert MoveMap.from_dict(LIFETIMES).for_target("r4").earlier == {
        "f": "it moved to n, which had it last in dist r3 (gone since r4)"}


def test_a_map_is_aimed_at_its_newest_release_by_default(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(LIFETIMES))
    assert load_map(path) == MoveMap.from_dict(LIFETIMES).for_target("r4")
    assert load_map(path, aimed=False) == MoveMap.from_dict(LIFETIMES)
    with pytest.raises(MoveMapError, match=r"dist r9 is not a release this map covers \(r1 to r4\)"):
        load_map(path, target_version="r9")


@pytest.mark.parametrize(("patch", "needle"), [
    ({"releases": ["r1", "r1"]}, "releases: lists an entry twice"),
    ({"lifetimes": {"old_module": {"f": [["r2", "r1"]]}}}, "is not a run of releases"),
    ({"lifetimes": {"old_module": {"f": [["r1", "r9"]]}}}, "is not a run of releases"),
    ({"lifetimes": {"other": {}}}, "unknown keys"),
    ({"lifetimes": {"old_module": {"f": "r1"}}}, r"expected a list of \[first, last\]"),
])
def test_malformed_lifetimes_are_refused(patch, needle):
    with pytest.raises(MoveMapError, match=needle):
        MoveMap.from_dict({**LIFETIMES, **patch})


def test_missing_required_key():
    with pytest.raises(MoveMapError, match="new_module"):
        MoveMap.from_dict({"old_module": "o", "moved": {}})


def test_load_map_errors_name_the_file(tmp_path):
    with pytest.raises(MoveMapError, match=r"nope\.json"):
        load_map(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MoveMapError, match=r"bad\.json is not valid JSON"):
        load_map(bad)
    arr = tmp_path / "arr.json"
    arr.write_text("[]")
    with pytest.raises(MoveMapError, match="expected a JSON object"):
        load_map(arr)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"old_module": "o", "new_module": "n", "moved": {}, "reexported": ["x"]}))
    with pytest.raises(MoveMapError, match=r"wrong\.json: re-exported"):
        load_map(wrong)


def test_load_map_from_file_equals_its_content(tmp_path):
    m = _random_map(random.Random(5))
    path = tmp_path / "m.json"
    path.write_text(m.to_json())
    assert load_map(path) == m


def test_shipped_map_is_canonical_and_generated():
    """The packaged map is derive output (header names the command) in canonical form."""
    from importlib import resources

    m = load_map(aimed=False)
    text = resources.files("mm_schedule.codemods").joinpath("maps", "sglang_mm_schedule.json").read_text("utf-8")
    assert m.to_json() == text
    assert m.header["command"].startswith("mm-schedule-codemod derive ")
    assert {s["role"] for s in m.header["sources"]} == {"old", "new"}
    assert all(len(s["sha256"]) == 64 for s in m.header["sources"])
    assert m.old_module == "sglang.srt.managers.mm_utils"
    assert m.new_module == "sglang.srt.managers.mm_schedule"
