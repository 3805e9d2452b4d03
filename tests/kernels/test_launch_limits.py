"""What a launch can take and how it is sized: 32-bit row limits refused on the host,
programs enough to fill the GPU for one image, launches cached per row bucket."""

import pytest
import torch

from mm_schedule.errors import SegmentError
from mm_schedule.kernels import tuned_configs
from mm_schedule.kernels.launch_config import TARGET_PROGRAMS, heuristic_config, row_bucket
from mm_schedule.kernels.segment_copy import launch as gather_mod
from mm_schedule.kernels.segment_copy.contract import INT32_MAX, check_segments
from mm_schedule.kernels.segment_copy.trusted import copy_segments

H200_SMS, MI300X_CUS = 132, 304


@pytest.mark.parametrize(
    "segment",
    [(0, 0, 4, INT32_MAX - 3), (0, INT32_MAX - 1, 2, 0), (0, 2**31, 1, 0), (0, 0, 2**31, 0)],
)
def test_rows_past_32_bits_are_refused_on_the_host(segment):
    with pytest.raises(SegmentError, match="32-bit"):
        check_segments([segment], [2**33], 2**33)
    check_segments([(0, 0, 4, INT32_MAX - 4)], [2**33], 2**33)  # the last row that fits


def test_a_trusted_single_segment_past_32_bits_is_refused_before_launch(triton_backend, monkeypatch):
    launched = []
    monkeypatch.setattr(gather_mod, "_launch", lambda *a: launched.append(a))
    source, dest = torch.zeros(4, 64, dtype=torch.float16), torch.zeros(4, 64, dtype=torch.float16)
    with pytest.raises(SegmentError, match="32-bit"):
        copy_segments([source], [(0, 0, 4, 2**31 - 2)], dest)
    assert not launched
    copy_segments([source], [(0, 0, 4, 0)], dest)
    assert len(launched) == 1


@pytest.mark.parametrize("kernel", ["segment_gather", "placeholder_merge"])
@pytest.mark.parametrize("hidden", [1152, 3584, 4096, 8192])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_image_launches_a_program_for_every_sm(kernel, hidden, dtype):
    config = heuristic_config(kernel, dtype=dtype, hidden=hidden, n_rows=1024)
    programs = -(-1024 // config["BLOCK_M"])
    assert programs >= MI300X_CUS > H200_SMS, config
    if hidden == 3584 and dtype == torch.bfloat16:
        assert config["BLOCK_M"] == 2 and programs == TARGET_PROGRAMS == 512  # 128 before
    # Taller tiles come back once rows are plentiful.
    assert heuristic_config(kernel, dtype=dtype, hidden=hidden, n_rows=1 << 16)["BLOCK_M"] == 16


def test_row_buckets_are_nearest_powers_of_two_on_a_log_scale():
    assert [row_bucket(n) for n in (0, 1, 2, 3, 5, 6, 181, 182, 1024, 1448, 1449)] == [
        1, 1, 2, 4, 4, 8, 128, 256, 1024, 1024, 2048,
    ]  # fmt: skip


def test_a_never_seen_image_size_reuses_its_buckets_launch(triton_backend, helpers):
    tuned_configs.clear_cache()
    dest = helpers.poisoned((64, 64), torch.float16)
    for rows in (33, 34, 40, 44):  # one bucket: 32
        source = helpers.random_rows(rows, 64, torch.float16)
        copy_segments([source], [(0, 0, rows, 1)], dest)
        helpers.assert_bitwise_equal(dest[1 : rows + 1], source)
    info = gather_mod._launch_for.cache_info()
    assert (info.misses, info.hits) == (1, 3)
