"""What the kernels compile to, read from PTX (sm_90) and AMDGCN (gfx942, gfx950) without a GPU.

- Vector width: rows whose length is a multiple of 8 elements but not of 16 (Triton only
  marks integer arguments divisible by 16) still move 16 bytes per load and store.
- Full tiles on AMD: the loop that copies a tile of ``BLOCK_M`` rows has no masks, so a
  store waits only for its own load instead of every load in flight (``s_waitcnt
  vmcnt(0)`` before each store) — also when the row length is no multiple of ``BLOCK_H``
  (one masked step after the loop) and in the placeholder merge (tiles of one kind).
- Casts: float32 -> bfloat16 uses the hardware conversion where there is one (sm_90's
  ``cvt.rn.bf16x2.f32``, gfx950's ``v_cvt_pk_bf16_f32``), not an integer rounding sequence.

Everything is compiled once, in one subprocess without ``TRITON_INTERPRET`` (under the
interpreter ``triton.jit`` gives nothing to compile), into a throwaway Triton cache.
"""

import json
import os
import subprocess
import sys

import pytest

from mm_schedule.kernels.tools import asm

pytest.importorskip("triton")

ODD_HIDDEN = (1000, 1176, 3592)  # multiples of 8, not of 16
# Row lengths that are no multiple of the heuristic's BLOCK_H (3584 below 8,192 rows).
FULL_TILE_SHAPES = ((1000, 8192), (1152, 1024), (3592, 8192), (3584, 1024))
DTYPES = ("bfloat16", "float16", "float32")

COMPILE = r"""
import json, sys
from pathlib import Path

import torch

from mm_schedule.kernels.launch_config import heuristic_config
from mm_schedule.kernels.tools.aot import aot_specs, assembly, compile_for

cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
for case in cases:
    dtype, src = getattr(torch, case["dtype"]), getattr(torch, case["src_dtype"])
    config = heuristic_config(case["kernel"], dtype=dtype, hidden=case["hidden"], n_rows=case["rows"])
    specs = aot_specs(case["kernel"], dtype=dtype, src_dtype=src, hidden=case["hidden"],
                      aligned=case["aligned"], config=config)
    (spec,) = [s for s in specs if s.variant == case["variant"]]
    (out / case["id"]).write_text(assembly(compile_for(spec, case["target"])))
    case["config"] = config
    case["even_h"] = spec.constexprs.get("EVEN_H")
print(json.dumps(cases))
"""


def _case(kernel, variant, dtype, hidden, target, src_dtype=None, aligned=True, rows=8192):
    src_dtype = src_dtype or dtype
    name = f"{kernel}-{variant}-{src_dtype}-to-{dtype}-{hidden}-{target}-{rows}"
    return dict(id=name, kernel=kernel, variant=variant, dtype=dtype, src_dtype=src_dtype,
                hidden=hidden, target=target, aligned=aligned, rows=rows)  # fmt: skip


def _cases():
    cases = []
    for hidden in ODD_HIDDEN:
        for dtype in DTYPES:
            for target in ("sm90", "gfx942"):
                cases.append(_case("segment_gather", "aligned", dtype, hidden, target))
                cases.append(_case("placeholder_merge", "aligned-merge", dtype, hidden, target))
    for target in ("sm90", "gfx942"):
        cases.append(_case("segment_gather", "aligned-one", "bfloat16", 1000, target))
        cases.append(_case("placeholder_merge", "aligned-lookup", "bfloat16", 1000, target))
        cases.append(_case("segment_gather", "unaligned", "bfloat16", 1000, target, aligned=False))
    for dtype in DTYPES:
        for variant in ("aligned", "aligned-one"):
            cases.append(_case("segment_gather", variant, dtype, 4096, "gfx942"))
    cases.append(_case("segment_gather", "aligned", "bfloat16", 4096, "sm90"))
    for target in ("sm90", "gfx950"):
        cases.append(_case("segment_gather", "aligned", "bfloat16", 4096, target, "float32"))
    cases.append(_case("placeholder_merge", "aligned-merge", "bfloat16", 4096, "sm90", "float32"))
    for hidden, rows in FULL_TILE_SHAPES:
        if hidden not in ODD_HIDDEN:
            cases.append(_case("segment_gather", "aligned", "bfloat16", hidden, "gfx942", rows=rows))
        cases.append(_case("segment_gather", "aligned-one", "bfloat16", hidden, "gfx942", rows=rows))
        cases.append(_case("placeholder_merge", "aligned-lookup", "bfloat16", hidden, "gfx942",
                           rows=rows))  # fmt: skip
        if hidden not in ODD_HIDDEN:
            cases.append(_case("placeholder_merge", "aligned-merge", "bfloat16", hidden, "gfx942",
                               rows=rows))  # fmt: skip
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
    return {c["id"]: (c, (folder / c["id"]).read_text()) for c in json.loads(done.stdout)}


def _pick(compiled, **where):
    found = [(c, text) for c, text in compiled.values() if all(c[k] == v for k, v in where.items())]
    assert found, where
    return found


def _vector_only(text: str) -> bool:
    """Every global store moves 16 bytes, as many 16-byte loads as stores feed them, and no
    load of 16 or 32 bits (an element at a time) is left; 8- and 64-bit loads are the
    mask, the ids and the tile table."""
    counts = asm.global_accesses(text)
    stores = {bits: n for (kind, bits), n in counts.items() if kind == "store"}
    narrow = sum(n for (kind, bits), n in counts.items() if kind == "load" and bits in (16, 32))
    return (
        set(stores) == {128}
        and counts[("load", 128)] >= stores[128]
        and narrow == 0
    )


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", ODD_HIDDEN)
def test_rows_of_8_but_not_16_elements_move_16_bytes_per_access(compiled, hidden, dtype, target):
    for case, text in _pick(compiled, hidden=hidden, dtype=dtype, target=target, aligned=True):
        assert _vector_only(text), (case["id"], dict(asm.global_accesses(text)))


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_other_launch_forms_too_and_the_unaligned_variant_is_scalar(compiled, target):
    for variant in ("aligned-one", "aligned-lookup"):
        ((case, text),) = _pick(compiled, variant=variant, target=target, hidden=1000)
        assert _vector_only(text), (case["id"], dict(asm.global_accesses(text)))
    # Guards the check itself: without the alignment promise the same kernel is scalar.
    ((case, text),) = _pick(compiled, variant="unaligned", target=target)
    assert not _vector_only(text), dict(asm.global_accesses(text))
    assert asm.global_accesses(text)[("store", 16)] > 0


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
    ((_, cast),) = _pick(compiled, target="gfx950", src_dtype="float32")
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
                            src_dtype="bfloat16", aligned=True):
        assert case["even_h"] is False, case  # no multiple of BLOCK_H: the tail path is compiled
        straight, _ = _tile_loops(text)
        # The lookup has two: tiles of placeholders only and tiles of text only.
        assert len(straight) == expected[case["variant"]], (case["id"], len(straight))
        assert all(_unserialised(loop) for loop in straight), [
            asm.waits_before_stores(loop) for loop in straight
        ]
