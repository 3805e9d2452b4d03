"""Fused text-embedding lookup + multimodal merge against F.embedding + index assignment."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_schedule.errors import EmbeddingLengthMismatch, KernelInputError
from mm_schedule.kernels.placeholder_merge import (
    embed_with_placeholders,
    embed_with_placeholders_ref,
)

VOCAB = 50
IMAGE = 151655  # far outside VOCAB, as in real checkpoints whose added tokens are not in the table


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_tokens=st.integers(1, 40),
    placeholder=st.sampled_from([IMAGE, VOCAB - 1]),
    weight_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    emb_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    out_dtype=st.sampled_from([None, torch.bfloat16]),
    hidden=st.sampled_from([64, 100]),
)
def test_matches_embedding_then_assignment(
    triton_backend, helpers, seed, n_tokens, placeholder, weight_dtype, emb_dtype, out_dtype, hidden
):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB - 1, (n_tokens,), generator=gen)
    ids[torch.rand(n_tokens, generator=gen) < 0.3] = placeholder
    mask = ids == placeholder
    weight = helpers.random_rows(VOCAB, hidden, weight_dtype, gen)
    embeddings = helpers.random_rows(int(mask.sum()), hidden, emb_dtype, gen)
    ids_before = ids.clone()
    out = None if out_dtype is None else helpers.poisoned((n_tokens, hidden), out_dtype)
    result = embed_with_placeholders(ids, weight, embeddings, placeholder, out=out, check=True)
    expected = F.embedding(ids.masked_fill(mask, 0), weight).to(result.dtype)
    expected[mask] = embeddings.to(result.dtype)
    helpers.assert_bitwise_equal(result, expected)
    assert torch.equal(ids, ids_before)  # the caller's ids were never clamped


def test_out_of_vocabulary_text_ids_give_zero_rows_without_check(triton_backend, helpers):
    ids = torch.tensor([3, -1, IMAGE, VOCAB, 7, VOCAB + 100])
    weight = helpers.random_rows(VOCAB, 64, torch.bfloat16)
    embeddings = helpers.random_rows(1, 64, torch.bfloat16)
    out = helpers.poisoned((6, 64), torch.bfloat16)
    embed_with_placeholders(ids, weight, embeddings, IMAGE, out=out)
    expected = helpers.poisoned((6, 64), torch.bfloat16)
    embed_with_placeholders_ref(ids, weight, embeddings, IMAGE, expected)
    helpers.assert_bitwise_equal(out, expected)
    assert torch.equal(out[[0, 4]], weight[[3, 7]]) and torch.equal(out[2], embeddings[0])
    assert out[[1, 3, 5]].eq(0).all()


def test_check_rejects_out_of_vocabulary_ids(triton_backend, helpers):
    weight = helpers.random_rows(VOCAB, 64, torch.float32)
    with pytest.raises(KernelInputError, match="outside the vocabulary"):
        embed_with_placeholders(
            torch.tensor([1, VOCAB]), weight, torch.empty(0, 64), IMAGE, check=True
        )


def test_check_rejects_count_mismatch(triton_backend, helpers):
    weight = helpers.random_rows(VOCAB, 64, torch.float32)
    with pytest.raises(EmbeddingLengthMismatch, match="expected 2, got 1"):
        embed_with_placeholders(
            torch.tensor([IMAGE, 1, IMAGE]), weight, torch.randn(1, 64), IMAGE, check=True
        )


def test_missing_embedding_rows_are_zero(triton_backend, helpers):
    weight = helpers.random_rows(VOCAB, 64, torch.float16)
    embeddings = helpers.random_rows(1, 64, torch.float16)
    out = embed_with_placeholders(torch.tensor([IMAGE, 4, IMAGE]), weight, embeddings, IMAGE)
    assert (
        torch.equal(out[0], embeddings[0]) and torch.equal(out[1], weight[4]) and out[2].eq(0).all()
    )


def test_batched_ids_allocate_batched_output(triton_backend, helpers):
    ids = torch.tensor([[1, IMAGE, 2], [IMAGE, IMAGE, 3]])
    weight = helpers.random_rows(VOCAB, 64, torch.bfloat16)
    embeddings = helpers.random_rows(3, 64, torch.bfloat16)
    out = embed_with_placeholders(ids, weight, embeddings, [IMAGE])
    assert out.shape == (2, 3, 64) and out.dtype == torch.bfloat16
    assert torch.equal(out[1, :2], embeddings[1:]) and torch.equal(out[0, 2], weight[2])


def test_weight_on_another_device_is_rejected(triton_backend):
    with pytest.raises(KernelInputError, match="weight is on meta"):
        embed_with_placeholders(
            torch.tensor([1]),
            torch.empty(VOCAB, 64, device="meta"),
            torch.empty(0, 64),
            IMAGE,
            out=torch.empty(1, 64),
        )
