"""Casting copies: every special value and a large random sweep of bit patterns, against
torch's own conversion (round to nearest even), through the kernel."""

import pytest
import torch

from mm_schedule.kernels.segment_copy.launch import gather_segments

_F32_SPECIAL_BITS = [
    0x00000000, 0x80000000,  # +-0
    0x7F800000, 0xFF800000,  # +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF, 0x7F808000,  # quiet and signalling NaNs
    0x7F7FFFFF, 0xFF7FFFFF,  # largest finite: rounds up to inf in bfloat16 and float16
    0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001,  # just under, at and over the bfloat16 overflow tie
    0x00800000, 0x007FFFFF, 0x00000001, 0x80000001, 0x00008000, 0x00018000,  # normal/subnormal edges
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties to even (down, up), just over, just under
    0x477FE000, 0x477FF000, 0x477FEFFF, 0x33800000, 0x33800001, 0x33000000,  # float16 max, tie to inf, min subnormal ties
]  # fmt: skip


def _special_rows(hidden=16):
    bits = torch.tensor(_F32_SPECIAL_BITS, dtype=torch.int64).to(torch.int32)
    values = bits.view(torch.float32)
    values = torch.cat([values, -values])
    rows = -(-values.numel() // hidden)
    padded = torch.zeros(rows * hidden)
    padded[: values.numel()] = values
    return padded.view(rows, hidden)


def _random_bit_rows(rows, hidden, seed):
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (rows, hidden), dtype=torch.int64, generator=gen)
    return bits.to(torch.int32).view(torch.float32)


def _check(source, dst_dtype):
    # Two segments, so both the table launch and (below) the one-segment launch are covered.
    half = source.shape[0] // 2
    for segments in ([(0, 0, half, 0), (0, half, source.shape[0] - half, half)], [(0, 0, source.shape[0], 0)]):
        out = torch.full((source.shape[0], source.shape[1]), 7.0, dtype=dst_dtype)
        gather_segments([source], segments, out=out)
        expected = source.to(dst_dtype)
        nan = source.isnan()
        assert torch.equal(out.isnan(), nan), "NaN must map to NaN and nothing else"
        bits = {2: torch.int16, 4: torch.int32}[out.element_size()]
        same = out.view(bits) == expected.view(bits)
        bad = ~(same | nan)
        assert not bad.any(), (
            f"{int(bad.sum())} values differ, e.g. {source[bad][:4].tolist()} ->"
            f" {out[bad][:4].tolist()} instead of {expected[bad][:4].tolist()}"
        )


@pytest.mark.parametrize("dst_dtype", [torch.bfloat16, torch.float16])
def test_float32_special_values(triton_backend, dst_dtype):
    _check(_special_rows(), dst_dtype)


@pytest.mark.parametrize(("src_dtype", "dst_dtype"), [
    (torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16),
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
])  # fmt: skip
def test_half_formats_every_bit_pattern(triton_backend, src_dtype, dst_dtype):
    source = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(src_dtype)
    _check(source.view(512, 128), dst_dtype)


@pytest.mark.parametrize("dst_dtype", [torch.bfloat16, torch.float16])
def test_float32_random_bit_patterns(triton_backend, dst_dtype):
    # About a million patterns: every exponent, both signs, NaN payloads, many ties.
    _check(_random_bit_rows(512, 2048, seed=dst_dtype.itemsize), dst_dtype)
