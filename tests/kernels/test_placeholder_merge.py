"""Merge by placeholder ids: sync-free, bit-exact against boolean-index assignment."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_schedule.errors import EmbeddingLengthMismatch, KernelInputError
from mm_schedule.kernels.placeholder_merge import (
    merge_by_placeholder_ids,
    merge_by_placeholder_ids_ref,
)

IMAGE, VIDEO = 151655, 151656


def random_ids(gen, n_tokens, placeholder_ids, fraction=0.4):
    ids = torch.randint(0, 1000, (n_tokens,), generator=gen)
    pick = torch.rand(n_tokens, generator=gen) < fraction
    choice = torch.tensor(placeholder_ids)[
        torch.randint(0, len(placeholder_ids), (n_tokens,), generator=gen)
    ]
    return torch.where(pick, choice, ids)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_tokens=st.integers(1, 40),
    placeholder_ids=st.sampled_from([[IMAGE], [IMAGE, VIDEO]]),
    emb_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    out_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
)
def test_matches_boolean_index_assignment(
    triton_backend, helpers, seed, n_tokens, placeholder_ids, emb_dtype, out_dtype
):
    gen = torch.Generator().manual_seed(seed)
    ids = random_ids(gen, n_tokens, placeholder_ids)
    mask = torch.isin(ids, torch.tensor(placeholder_ids))
    embeddings = helpers.random_rows(int(mask.sum()), 64, emb_dtype, gen)
    embeds = helpers.poisoned((n_tokens, 64), out_dtype)
    expected = embeds.clone()
    expected[mask] = embeddings.to(out_dtype)
    ids_before = ids.clone()
    merge_by_placeholder_ids(ids, placeholder_ids, embeddings, embeds, check=True)
    helpers.assert_bitwise_equal(embeds, expected)
    assert torch.equal(ids, ids_before)


@pytest.mark.parametrize("n_embeddings", [0, 2, 5, 9])
def test_count_mismatch_without_check_never_reads_out_of_bounds(
    triton_backend, helpers, n_embeddings
):
    gen = torch.Generator().manual_seed(n_embeddings)
    ids = torch.tensor([1, IMAGE, IMAGE, 2, IMAGE, IMAGE, IMAGE, 3])  # five placeholders
    embeddings = helpers.random_rows(n_embeddings, 64, torch.float16, gen)
    embeds = helpers.poisoned((8, 64), torch.float16)
    expected = embeds.clone()
    merge_by_placeholder_ids_ref(ids, IMAGE, embeddings, expected)
    merge_by_placeholder_ids(ids, IMAGE, embeddings, embeds)
    helpers.assert_bitwise_equal(embeds, expected)
    taken = min(n_embeddings, 5)
    positions = (ids == IMAGE).nonzero().flatten()
    assert torch.equal(embeds[positions[:taken]], embeddings[:taken])
    assert embeds[positions[taken:]].isnan().all()  # placeholders without a row keep what was there


@pytest.mark.parametrize("n_embeddings", [4, 6])
def test_check_raises_on_count_mismatch(triton_backend, helpers, n_embeddings):
    ids = torch.tensor([IMAGE] * 5 + [7])
    embeds = helpers.poisoned((6, 64), torch.bfloat16)
    with pytest.raises(EmbeddingLengthMismatch, match=f"expected 5, got {n_embeddings}"):
        merge_by_placeholder_ids(
            ids, IMAGE, helpers.random_rows(n_embeddings, 64, torch.bfloat16), embeds, check=True
        )
    assert embeds.isnan().all()


def test_batched_input_ids(triton_backend, helpers):
    gen = torch.Generator().manual_seed(3)
    ids = random_ids(gen, 2 * 16, [IMAGE]).view(2, 16)
    mask = ids == IMAGE
    embeddings = helpers.random_rows(int(mask.sum()), 64, torch.bfloat16, gen)
    embeds = helpers.random_rows(32, 64, torch.bfloat16, gen).view(2, 16, 64)
    expected = embeds.clone()
    expected[mask] = embeddings
    merge_by_placeholder_ids(ids, IMAGE, embeddings, embeds)
    helpers.assert_bitwise_equal(embeds.view(32, 64), expected.view(32, 64))


def test_a_wide_placeholder_id_is_not_narrowed_into_a_token_id(triton_backend, helpers):
    """int64 placeholder ids against int32 ``input_ids``: 2**32 + 7 is not token 7 (the ids
    are compared as int64, never cast down to the tokens' dtype)."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.tensor([7, 9, 7, 9], dtype=torch.int32)
    embeddings = helpers.random_rows(2, 64, torch.float32, gen)
    embeds = helpers.random_rows(4, 64, torch.float32, gen)
    expected = embeds.clone()
    expected[[1, 3]] = embeddings
    merge_by_placeholder_ids(ids, torch.tensor([(1 << 32) + 7, 9]), embeddings, embeds, check=True)
    helpers.assert_bitwise_equal(embeds, expected)


def test_no_sync_prone_calls(triton_backend, helpers):
    """The call path must not use ops that need the device's answer on the host."""
    from torch.overrides import TorchFunctionMode

    forbidden = {
        "item",
        "nonzero",
        "tolist",
        "__bool__",
        "__int__",
        "masked_select",
        "argwhere",
        "__index__",
    }

    class NoSync(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            assert name not in forbidden, f"sync-prone call {name}"
            return func(*args, **(kwargs or {}))

    ids = torch.tensor([IMAGE, 3, IMAGE, IMAGE, 9])
    embeddings = helpers.random_rows(3, 64, torch.float32)
    embeds = helpers.poisoned((5, 64), torch.float32)
    with NoSync():
        merge_by_placeholder_ids(ids, IMAGE, embeddings, embeds)
    assert torch.equal(embeds[[0, 2, 3]], embeddings)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embeddings": torch.randn(2, 32)}, r"embeddings must be \[rows, 64\]"),
        ({"input_embeds": torch.randn(6, 64)}, "expected"),
        ({"input_ids": torch.randn(5)}, "integer tensor"),
        ({"placeholder_ids": []}, "placeholder_ids is empty"),
    ],
)
def test_bad_input_is_rejected(triton_backend, kwargs, message):
    args = {
        "input_ids": torch.tensor([IMAGE, 1, 2, 3, 4]),
        "placeholder_ids": IMAGE,
        "embeddings": torch.randn(1, 64),
        "input_embeds": torch.zeros(5, 64),
        **kwargs,
    }
    with pytest.raises(KernelInputError, match=message):
        merge_by_placeholder_ids(**args)
