"""What the kernels compile to, read from PTX (sm_80, sm_90) and AMDGCN (gfx90a, gfx942,
gfx950) without a GPU, under whichever Triton is installed (CI runs this module under the
pinned Triton and under Triton 3.6).

- Vector width: at every row length the tests name (H = 1000, 1152, 1176, 3584, 3592,
  7168: multiples of 8 elements, not all of 16, which is all Triton marks on an integer
  argument) and every row count from 1 to 65,536, every global load and store of the
  copy moves 16 bytes, for bfloat16, float16 and float32 rows. The row count reaches the
  compiled code only through the config it picks (tile height, ``BLOCK_H``, warps, and
  whether ``BLOCK_H`` divides the row): the sweep compiles each distinct one once per
  kernel, on sm_90 and gfx942, and each dtype and tail/no-tail case once per launch form
  on every target.
- Full tiles on AMD: the loop that copies a tile of ``BLOCK_M`` rows has no masks, so a
  store waits only for its own load instead of every load in flight (``s_waitcnt
  vmcnt(0)`` before each store) — also when the row length is no multiple of ``BLOCK_H``
  (one masked step after the loop) and in the placeholder merge (tiles of one kind).
- Finding a segment: a binary search of scalar loads, no barrier, a few dozen
  instructions a step on sm_90.
- Casts: float32 -> bfloat16 uses the hardware conversion where there is one (sm_90's
  ``cvt.rn.bf16x2.f32``, gfx950's ``v_cvt_pk_bf16_f32``), not an integer rounding sequence.

Everything is compiled once, in one subprocess without ``TRITON_INTERPRET`` (under the
interpreter ``triton.jit`` gives nothing to compile), into a throwaway Triton cache, by a
few worker processes.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from mm_schedule.kernels.launch_config import heuristic_config
from mm_schedule.kernels.tools import asm

pytest.importorskip("triton")

HIDDEN = (1000, 1152, 1176, 3584, 3592, 7168)
ODD_HIDDEN = (1000, 1176, 3592)  # multiples of 8, not of 16
ROW_COUNTS = tuple(1 << e for e in range(17))  # 1 .. 65,536: every config bucket
# Row lengths that are no multiple of the heuristic's BLOCK_H (3584 below 8,192 rows).
FULL_TILE_SHAPES = ((1000, 8192), (1152, 1024), (3592, 8192), (3584, 1024))
DTYPES = ("bfloat16", "float16", "float32")
SWEEP_TARGETS = ("sm90", "gfx942")
OTHER_TARGETS = ("sm80", "gfx90a", "gfx950")
# Per kernel: the launch form every config is compiled for, then the other forms.
FORMS = {"segment_gather": ("aligned", "aligned-one"),
         "placeholder_merge": ("aligned-merge", "aligned-lookup")}  # fmt: skip

COMPILE = r"""
import json, os, sys
from multiprocessing import get_context
from pathlib import Path

import torch

from mm_schedule.kernels.tools.aot import aot_specs, assembly, compile_for, sass

def build(case):
    dtype, src = getattr(torch, case["dtype"]), getattr(torch, case["src_dtype"])
    specs = aot_specs(case["kernel"], dtype=dtype, src_dtype=src, hidden=case["hidden"],
                      aligned=case["aligned"], config=case["config"])
    (spec,) = [s for s in specs if s.variant == case["variant"]]
    compiled = compile_for(spec, case["target"])
    (out / case["id"]).write_text(assembly(compiled))
    if case.get("sass"):
        (out / (case["id"] + ".sass")).write_text(sass(compiled))
    case["even_h"] = spec.constexprs.get("EVEN_H")
    return case

cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
with get_context("fork").Pool(min(4, os.cpu_count() or 1)) as pool:
    print(json.dumps(pool.map(build, cases, chunksize=4)))
"""


def _case(kernel, variant, dtype, hidden, target, src_dtype=None, aligned=True, rows=8192, **extra):
    src_dtype = src_dtype or dtype
    config = heuristic_config(kernel, dtype=getattr(torch, dtype), hidden=hidden, n_rows=rows)
    name = f"{kernel}-{variant}-{src_dtype}-to-{dtype}-{hidden}-{target}-{rows}"
    return dict(id=name, kernel=kernel, variant=variant, dtype=dtype, src_dtype=src_dtype,
                hidden=hidden, target=target, aligned=aligned, rows=rows, config=config,
                **extra)  # fmt: skip


def _config_key(case):
    return (case["kernel"], case["dtype"], tuple(case["config"].values()),
            case["hidden"] % case["config"]["BLOCK_H"] == 0)  # fmt: skip


def _width_cases():
    """One compile per distinct specialisation the rows and row lengths above reach: the
    main launch form of each kernel for every config, on the two sweep targets; every
    launch form for each (dtype, tail or not), on every target."""
    cases, configs, forms = [], set(), set()
    for kernel, (main, *others) in FORMS.items():
        for dtype in DTYPES:
            for hidden in HIDDEN:
                for rows in ROW_COUNTS:
                    case = _case(kernel, main, dtype, hidden, "", rows=rows, sweep=True)
                    key = _config_key(case)
                    if key not in configs:
                        configs.add(key)
                        cases += [{**case, "target": t, "id": case["id"] + t} for t in SWEEP_TARGETS]
                    if key[:2] + key[3:] not in forms:
                        forms.add(key[:2] + key[3:])
                        cases += [_case(kernel, form, dtype, hidden, t, rows=rows, sweep=True)
                                  for form in (main, *others) for t in OTHER_TARGETS]
                        cases += [_case(kernel, form, dtype, hidden, t, rows=rows, sweep=True)
                                  for form in others for t in SWEEP_TARGETS]
    return [{**case, "id": "sweep-" + case["id"]} for case in cases]


def _cases():
    cases = _width_cases()
    for target in ("sm90", "gfx942"):
        cases.append(_case("segment_gather", "unaligned", "bfloat16", 1000, target, aligned=False))
    for dtype in DTYPES:
        for variant in ("aligned", "aligned-one"):
            cases.append(_case("segment_gather", variant, dtype, 4096, "gfx942"))
    cases.append(_case("segment_gather", "aligned", "bfloat16", 4096, "sm90"))
    for target in ("sm90", "gfx950"):
        cases.append(_case("segment_gather", "aligned", "bfloat16", 4096, target, "float32"))
    cases.append(_case("placeholder_merge", "aligned-merge", "bfloat16", 4096, "sm90", "float32"))
    for hidden, rows in FULL_TILE_SHAPES:
        for variant in ("aligned", "aligned-one", "aligned-merge", "aligned-lookup"):
            kernel = "segment_gather" if variant in FORMS["segment_gather"] else "placeholder_merge"
            cases.append(_case(kernel, variant, "bfloat16", hidden, "gfx942", rows=rows))
    cases.append(_case("segment_gather", "aligned", "bfloat16", 3584, "sm90", rows=512, sass=True))
    return list({c["id"]: c for c in cases}.values())


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, aot_cache_dir):
    """``id -> (case, assembly text)`` for every case above, compiled once."""
    folder = tmp_path_factory.mktemp("asm")
    (folder / "cases.json").write_text(json.dumps(_cases()))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = aot_cache_dir
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, str(folder / "cases.json"), str(folder)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    cases = json.loads(done.stdout)
    for case in cases:
        if case.get("sass"):
            case["sass_text"] = (folder / (case["id"] + ".sass")).read_text()
    return {c["id"]: (c, (folder / c["id"]).read_text()) for c in cases}


def _pick(compiled, **where):
    """The compiled cases whose fields match ``where`` (a field a case lacks matches None)."""
    found = [(c, text) for c, text in compiled.values() if all(c.get(k) == v for k, v in where.items())]
    assert found, where
    return found


def _vector_only(text: str) -> bool:
    """Every global store moves 16 bytes, rows are loaded 16 bytes at a time, and no load
    of 16 or 32 bits (an element at a time) is left; 8- and 64-bit loads are the mask, the
    ids and the segment table. (Loads may be fewer than stores: a one-row tile of the
    lookup that is neither placeholder nor text stores zeros it never loads.)"""
    counts = asm.global_accesses(text)
    stores = {bits for (kind, bits), n in counts.items() if kind == "store" and n}
    narrow = sum(n for (kind, bits), n in counts.items() if kind == "load" and bits in (16, 32))
    return stores == {128} and counts[("load", 128)] > 0 and narrow == 0


@pytest.mark.parametrize("target", SWEEP_TARGETS + OTHER_TARGETS)
@pytest.mark.parametrize("kernel", FORMS)
def test_every_row_length_and_row_count_moves_16_bytes_per_access(compiled, kernel, target):
    swept = _pick(compiled, kernel=kernel, target=target, sweep=True)
    narrow = {c["id"]: dict(asm.global_accesses(text)) for c, text in swept if not _vector_only(text)}
    assert not narrow, narrow
    forms = {c["variant"] for c, _ in swept}
    assert forms == set(FORMS[kernel]), forms
    assert {c["dtype"] for c, _ in swept} == set(DTYPES)
    assert {c["even_h"] for c, _ in swept} == {True, False}  # with and without the tail step


def test_the_sweep_holds_every_config_the_rows_reach(compiled):
    """Guards the sweep's deduplication: every (H, rows, dtype) maps to a compiled config."""
    swept = {_config_key(c) for c, _ in _pick(compiled, sweep=True, target="sm90")}
    swept &= {_config_key(c) for c, _ in _pick(compiled, sweep=True, target="gfx942")}
    for kernel in FORMS:
        for dtype in DTYPES:
            for hidden in HIDDEN:
                for rows in ROW_COUNTS:
                    assert _config_key(_case(kernel, "", dtype, hidden, "", rows=rows)) in swept


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_the_unaligned_variant_is_scalar(compiled, target):
    # Guards the check itself: without the alignment promise the same kernel is scalar.
    ((_, text),) = _pick(compiled, variant="unaligned", target=target)
    assert not _vector_only(text), dict(asm.global_accesses(text))
    assert asm.global_accesses(text)[("store", 16)] > 0


def test_programs_find_their_segment_by_a_short_search_without_barriers(compiled):
    """The table form on sm_90: no barrier anywhere, and the one loop that stores nothing
    (the search) is short; at 4,096 segments a program runs it 13 times."""
    ((case, ptx),) = _pick(compiled, variant="aligned", target="sm90", hidden=3584, rows=512,
                           sass=True)  # fmt: skip
    assert "bar.sync" not in ptx and "barrier" not in ptx
    sass = case["sass_text"]
    assert "BAR.SYNC" not in sass and "BAR.ARV" not in sass
    search = [loop for loop in asm.sass_loops(sass) if "STG" not in loop.text]
    assert len(search) == 1, [loop.instructions for loop in asm.sass_loops(sass)]
    assert search[0].instructions <= 32, search[0].instructions
    assert "LDG" in search[0].text  # one table load a step


def _tile_loops(text: str) -> tuple[list[str], list[str]]:
    """(loops without a branch but their back edge, loops with more branches) among the
    loops that store."""
    storing = [body for body in asm.loops(text) if asm.waits_before_stores(body)]
    straight = [b for b in storing if b.count("s_cbranch") == 1 and "s_and_saveexec" not in b]
    return straight, [b for b in storing if b not in straight]


@pytest.mark.parametrize("variant", ["aligned", "aligned-one"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_full_tiles_on_gfx942_store_without_waiting_for_every_load(compiled, dtype, variant):
    ((case, text),) = _pick(compiled, variant=variant, dtype=dtype, hidden=4096, target="gfx942")
    assert case["even_h"] is True, case  # 4096 is a multiple of BLOCK_H: the full-tile path exists
    straight, masked = _tile_loops(text)
    assert len(straight) == 1, f"expected one unmasked tile loop, found {len(straight)}"
    waits = asm.waits_before_stores(straight[0])
    assert len(waits) >= 2, waits
    # Each store waits for its own load only: the other loads of the step stay in flight.
    assert all(w.startswith("vmcnt(") and w != "vmcnt(0)" for w in waits), waits
    assert straight[0].count("s_waitcnt vmcnt(0)") <= 1
    # The partial tile (masked rows) still serialises, which is what the check would see
    # if the full-tile path were gone.
    assert masked and all(w == "vmcnt(0)" for b in masked for w in asm.waits_before_stores(b))


def _conversion_work(ops) -> int:
    """Integer and select instructions a rounding sequence would add."""
    return sum(n for op, n in ops.items() if op.split(".")[0] in ("shr", "and", "selp", "setp", "add"))


def test_fp32_to_bf16_uses_the_native_conversion_on_sm90(compiled):
    ((case, cast),) = _pick(compiled, kernel="segment_gather", variant="aligned", target="sm90",
                            src_dtype="float32", dtype="bfloat16")  # fmt: skip
    ((_, plain),) = _pick(compiled, kernel="segment_gather", variant="aligned", target="sm90",
                          src_dtype="bfloat16", dtype="bfloat16", hidden=4096)  # fmt: skip
    ops, plain_ops = asm.instructions(cast), asm.instructions(plain)
    native = ops["cvt.rn.bf16x2.f32"] + ops["cvt.rn.bf16.f32"]
    per_thread = case["config"]["BLOCK_M"] * case["config"]["BLOCK_H"] // (32 * 4)
    assert native * 2 >= per_thread, (native, per_thread)  # every element through cvt.rn
    # No integer rounding sequence (round bias 0x7FFF, NaN 0x7FC0) around it: the cast
    # kernel does no more integer work than the same copy without a cast, give or take
    # the address arithmetic of its wider loads.
    assert "32767" not in cast and "32704" not in cast
    assert _conversion_work(ops) <= _conversion_work(plain_ops) + 24, (
        _conversion_work(ops), _conversion_work(plain_ops),
    )  # fmt: skip
    ((_, merge),) = _pick(compiled, kernel="placeholder_merge", target="sm90", src_dtype="float32",
                          dtype="bfloat16")  # fmt: skip
    assert asm.instructions(merge)["cvt.rn.bf16x2.f32"] > 0


def test_fp32_to_bf16_uses_the_native_conversion_on_gfx950(compiled):
    ((_, cast),) = _pick(compiled, target="gfx950", src_dtype="float32", dtype="bfloat16")
    assert asm.instructions(cast)["v_cvt_pk_bf16_f32"] > 0
    assert "0x7fff" not in cast.lower()


def _unserialised(loop: str) -> bool:
    """No store waits for a load other than its own: with one load per step the wait for
    it is ``vmcnt(0)``; with more, each store leaves the others in flight."""
    waits = asm.waits_before_stores(loop)
    loads = sum(n for (kind, _), n in asm.global_accesses(loop).items() if kind == "load")
    if loads == 1:
        return waits == ["vmcnt(0)"]
    return bool(waits) and all(w.startswith("vmcnt(") and w != "vmcnt(0)" for w in waits)


@pytest.mark.parametrize(("hidden", "rows"), FULL_TILE_SHAPES)
def test_full_tiles_of_odd_row_lengths_store_without_waiting_for_every_load(compiled, hidden, rows):
    """The row length is no multiple of BLOCK_H: the full tile's loop is still unmasked
    (its one masked step runs after it), in both kernels and every launch form."""
    expected = {"aligned": 1, "aligned-one": 1, "aligned-merge": 1, "aligned-lookup": 2}
    for case, text in _pick(compiled, hidden=hidden, rows=rows, target="gfx942", dtype="bfloat16",
                            src_dtype="bfloat16", aligned=True, sweep=None):
        assert case["even_h"] is False, case  # no multiple of BLOCK_H: the tail path is compiled
        straight, _ = _tile_loops(text)
        # The lookup has two: tiles of placeholders only and tiles of text only.
        assert len(straight) == expected[case["variant"]], (case["id"], len(straight))
        assert all(_unserialised(loop) for loop in straight), [
            asm.waits_before_stores(loop) for loop in straight
        ]
