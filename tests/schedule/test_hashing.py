"""content_hash: what it covers, what it refuses, and that it is the same in every process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mm_schedule import content_hash
from mm_schedule.errors import InvalidItemError


def _pixels(seed: int = 0, shape=(3, 8, 8)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_every_input_of_the_embedding_changes_the_hash():
    pixels = _pixels()
    base = content_hash(pixels, model="m")
    assert content_hash(pixels.clone(), model="m") == base  # content, not identity
    flipped = pixels.clone()
    flipped.view(-1)[17] = torch.nextafter(flipped.view(-1)[17], torch.tensor(1e9))  # one ulp
    variants = {
        "one ulp": content_hash(flipped, model="m"),
        "model": content_hash(pixels, model="m2"),
        "modality": content_hash(pixels, model="m", modality="VIDEO"),
        "dtype": content_hash(pixels.double(), model="m"),
        "shape": content_hash(pixels.reshape(3, 4, 16), model="m"),
        "grid": content_hash(pixels, model="m", grid=(1, 8, 8)),
    }
    assert all(v != base for v in variants.values()), variants
    assert len(set(variants.values())) == len(variants)
    assert 0 <= base < 2**63


def test_flattened_patch_rows_need_their_grid():
    rows = _pixels(shape=(24, 12))
    with pytest.raises(InvalidItemError, match=r"flattened patch rows: pass their grid"):
        content_hash(rows, model="m")
    wide, tall = content_hash(rows, model="m", grid=(1, 4, 6)), content_hash(rows, model="m", grid=(1, 6, 4))
    assert wide != tall
    assert content_hash(rows, model="m", grid=torch.tensor([1, 4, 6])) == wide
    with pytest.raises(InvalidItemError, match=r"grid \(1, 4, 4\) describes 16 patch rows, the pixels have 24"):
        content_hash(rows, model="m", grid=(1, 4, 4))
    with pytest.raises(InvalidItemError, match="three positive sizes"):
        content_hash(rows, model="m", grid=(4, 6))


def test_model_identity_is_required_and_data_must_be_a_tensor():
    with pytest.raises(InvalidItemError, match="non-empty model identity"):
        content_hash(_pixels(), model="")
    with pytest.raises(TypeError, match="got list"):
        content_hash([1.0, 2.0], model="m")


def test_bfloat16_hashes_its_own_bytes():
    pixels = _pixels()
    assert content_hash(pixels.bfloat16(), model="m") != content_hash(pixels, model="m")
    assert content_hash(pixels.bfloat16(), model="m") == content_hash(pixels.bfloat16().clone(), model="m")


def test_same_hash_in_another_process_with_another_hash_seed():
    pixels = _pixels(seed=3)
    here = content_hash(pixels, model="qwen")
    code = (
        "import torch; from mm_schedule import content_hash;"
        "p = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(3));"
        "print(content_hash(p, model='qwen'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    assert int(out.stdout.strip()) == here
