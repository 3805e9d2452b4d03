"""Ahead-of-time compilation of every kernel variant and config for NVIDIA and AMD targets.

Runs in one subprocess without TRITON_INTERPRET (under the interpreter ``triton.jit``
returns an interpreter object that cannot be compiled), with a throwaway cache folder.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

TARGETS = ("sm80", "sm90", "gfx90a", "gfx942", "gfx950")
CONFIG_DIR = Path(__file__).resolve().parents[2] / "kernels" / "configs"


@pytest.fixture(scope="module")
def compiled(aot_cache_dir):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = aot_cache_dir
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-m", "mm_schedule.kernels.tools.aot", "--targets", ",".join(TARGETS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_every_kernel_variant_and_target_compiled(compiled):
    seen = {(r["kernel"], r["variant"], r["target"]) for r in compiled}
    for target in TARGETS:
        for variant in ("aligned", "unaligned"):
            assert ("segment_gather", variant, target) in seen
            for mode in ("merge", "lookup"):
                assert ("placeholder_merge", f"{variant}-{mode}", target) in seen
    dtypes = {(r["dtype"], r["src_dtype"]) for r in compiled}
    assert {
        ("bfloat16", "bfloat16"),
        ("float16", "float16"),
        ("float32", "float32"),
        ("bfloat16", "float32"),
    } <= dtypes


def test_every_shipped_config_compiled(compiled):
    from mm_schedule.kernels.tools.aot import shipped_configs

    origins = {r["origin"] for r in compiled}
    for *_, path in shipped_configs(CONFIG_DIR):
        assert path in origins


def test_aligned_variants_use_16_byte_loads_and_stores(compiled):
    scalar = [r for r in compiled if r["aligned"] and not (r["vector_load"] and r["vector_store"])]
    assert not scalar, f"aligned variants without 16-byte vector access: {scalar[:3]}"


def test_unaligned_variants_are_really_unhinted(compiled):
    # Guards the test itself: if the unaligned variant vectorised, the scan would be meaningless.
    assert not any(r["vector_load"] for r in compiled if not r["aligned"])


def test_no_register_spills(compiled):
    spilled = [r for r in compiled if r["spill_bytes"]]
    assert not spilled, f"register spills: {spilled[:3]}"


def test_shipped_configs_are_read_in_the_tuner_layout(tmp_path):
    from mm_schedule.kernels.tools.aot import shipped_configs

    small = {"BLOCK_M": 8, "BLOCK_H": 256, "num_warps": 2, "num_stages": 1}
    big = {"BLOCK_M": 16, "BLOCK_H": 1024, "num_warps": 4, "num_stages": 2}
    (tmp_path / "segment_gather").mkdir()
    (tmp_path / "segment_gather" / "NVIDIA_H200.json").write_text(
        json.dumps(
            {
                "kernel": "segment_gather",
                "triton_version": "3.9.0",
                "configs": {
                    "float16": {"3584": {"16": small, "8192": big}},
                    "bfloat16": {"1152": {"64": small}},
                },
            }
        )
    )
    (tmp_path / "not_a_kernel").mkdir()
    (tmp_path / "not_a_kernel" / "x.json").write_text(
        json.dumps({"configs": {"bfloat16": {"64": {"1": small}}}})
    )
    found = sorted((k, d, h, tuple(c.values())) for k, d, h, c, _ in shipped_configs(tmp_path))
    assert found == [
        ("segment_gather", "bfloat16", 1152, tuple(small.values())),
        ("segment_gather", "float16", 3584, tuple(small.values())),
        ("segment_gather", "float16", 3584, tuple(big.values())),
    ]
