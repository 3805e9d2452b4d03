"""The placeholder mask (which tokens of ``input_ids`` are placeholder ids), on both of
its CPU paths: the package's C helper and the torch code it falls back to. Every case
is checked against ``torch.isin`` in int64, with fresh random inputs."""

import shutil
import sysconfig

import pytest
import torch

import mm_schedule
from mm_schedule import placeholders
from mm_schedule.errors import EmbeddingLengthMismatch, InvalidItemError
from mm_schedule.sglang_compat import checked_mask


@pytest.fixture(params=["c-helper", "torch"])
def membership(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setattr(placeholders, "_placeholder_set", None)
    elif placeholders._placeholder_set is None:
        pytest.skip("the C helper is not built in this install")
    return request.param


def _isin(input_ids, ids):
    return torch.isin(input_ids.reshape(-1).to(torch.int64), ids.reshape(-1).to(torch.int64))


def test_c_helper_is_built_where_a_compiler_is():
    """An install on a machine with a C compiler has the helper: if it is missing there,
    its build broke and the fallback would hide that."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if placeholders._placeholder_set is None and shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on this machine")
    assert placeholders._placeholder_set is not None


@pytest.mark.parametrize("n_ids", [0, 1, 3, 300])
def test_matches_isin(membership, n_ids):
    g = torch.Generator().manual_seed(n_ids)
    ids = torch.randint(1_000_000, 1_000_000 + 2 * max(n_ids, 1), (n_ids,), generator=g)
    input_ids = torch.cat([ids, torch.randint(0, 1_000_000 + 3 * max(n_ids, 1), (500,), generator=g)])
    input_ids = input_ids[torch.randperm(input_ids.numel(), generator=g)]
    mask, marked = placeholders.marked_placeholders(input_ids, ids)
    assert mask.shape == (input_ids.numel(), 1) and mask.dtype == torch.bool
    assert torch.equal(mask[:, 0], _isin(input_ids, ids))
    assert marked == int(_isin(input_ids, ids).sum())
    assert torch.equal(mm_schedule.placeholder_mask(input_ids, ids), mask)


@pytest.mark.parametrize("seed", range(6))
def test_random_dtypes_signs_and_runs(membership, seed):
    """Negative and 64-bit ids, int32 or int64 tokens, runs of one id (an image's
    placeholders), tokens as a strided view, ids as any integer dtype."""
    g = torch.Generator().manual_seed(1000 + seed)
    token_dtype = (torch.int64, torch.int32)[seed % 2]
    info = torch.iinfo(token_dtype)
    n_ids = int(torch.randint(1, 3000, (1,), generator=g))
    ids = torch.randint(info.min, info.max, (n_ids,), generator=g, dtype=torch.int64)
    if seed % 3 == 0:
        ids = ids % 512 - 256  # small, many repeated
    runs = ids[torch.randint(0, n_ids, (200,), generator=g)].repeat_interleave(
        torch.randint(1, 40, (200,), generator=g))
    text = torch.randint(info.min, info.max, (3000,), generator=g, dtype=torch.int64)
    tokens = torch.cat([runs, text])[torch.randperm(runs.numel() + 3000, generator=g)].to(token_dtype)
    tokens = torch.stack([tokens, tokens.flip(0)], 1)[:, 0]  # not contiguous
    for pads in (ids, ids.to(torch.int32) if seed % 3 == 0 else ids, ids.view(-1, 1)):
        mask, marked = placeholders.marked_placeholders(tokens, pads)
        expected = _isin(tokens, pads)
        assert torch.equal(mask[:, 0], expected) and marked == int(expected.sum())


def test_int64_placeholder_ids_are_never_narrowed(membership):
    wide = 5 + 2**32  # as int32 this would be 5
    ids = torch.tensor([5, 7, 5, 3], dtype=torch.int32)
    assert not placeholders.placeholder_mask(ids, torch.tensor([wide])).any()
    many = torch.arange(100, dtype=torch.int64) + 2**32  # the table lookup path
    assert not placeholders.placeholder_mask(torch.arange(100, dtype=torch.int32), many).any()
    assert placeholders.placeholder_mask(ids, torch.tensor([7])).squeeze(1).tolist() == [False, True, False, False]


@pytest.mark.parametrize("n_ids", [9, 64, 1000])
def test_ids_sharing_their_low_or_high_bits(membership, n_ids):
    """Ids that agree on many bits pile into few buckets of a naive table; exact anyway."""
    g = torch.Generator().manual_seed(n_ids)
    for pads in (torch.arange(n_ids, dtype=torch.int64) << 24, torch.arange(n_ids, dtype=torch.int64) << 50):
        tokens = torch.cat([pads[torch.randint(0, n_ids, (50,), generator=g)],
                            torch.randint(0, 1 << 30, (500,), generator=g)])
        assert torch.equal(placeholders.placeholder_mask(tokens, pads).squeeze(1), torch.isin(tokens, pads))


@pytest.mark.parametrize("distinct", [1, 3, 40])
def test_ids_repeated_once_per_item(membership, distinct):
    """One image token id per item, repeated (deep buckets): still exactly isin."""
    g = torch.Generator().manual_seed(distinct)
    values = torch.randint(100_000, 200_000, (distinct,), generator=g)
    pads = values[torch.randint(0, distinct, (600,), generator=g)]
    input_ids = torch.randint(0, 200_000, (5000,), generator=g)
    input_ids[torch.randint(0, 5000, (2000,), generator=g)] = values[torch.randint(0, distinct, (2000,), generator=g)]
    mask = placeholders.placeholder_mask(input_ids, pads)
    assert mask.shape == (5000, 1)
    assert torch.equal(mask[:, 0], torch.isin(input_ids, values))


def test_empty_tokens_and_no_ids(membership):
    assert placeholders.marked_placeholders(torch.empty(0, dtype=torch.int64), torch.tensor([3]))[1] == 0
    mask, marked = placeholders.marked_placeholders(torch.tensor([1, 2]), torch.empty(0, dtype=torch.int64))
    assert marked == 0 and mask.shape == (2, 1) and not mask.any()


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 2.0]), torch.tensor([True, False])])
def test_non_integer_tokens_or_ids_are_refused(membership, bad):
    with pytest.raises(InvalidItemError, match="input_ids must be an integer tensor"):
        placeholders.placeholder_mask(bad, torch.tensor([1]))
    with pytest.raises(InvalidItemError, match="placeholder ids must be an integer tensor"):
        placeholders.placeholder_mask(torch.tensor([1, 2]), bad)


def test_checked_mask_counts_on_both_paths(membership):
    tokens = torch.tensor([0, 9, 9, 9, 0, 7])
    assert int(checked_mask(tokens, torch.tensor([9, 7]), 4).sum()) == 4
    with pytest.raises(EmbeddingLengthMismatch, match="expected 4, got 3"):
        checked_mask(tokens, torch.tensor([9, 7]), 3)


def test_c_helper_refuses_bad_arguments():
    helper = placeholders._placeholder_set
    if helper is None:
        pytest.skip("the C helper is not built in this install")
    tokens, ids, out = torch.tensor([1, 2]), torch.tensor([2]), torch.empty(2, dtype=torch.bool)
    args = [tokens.data_ptr(), 2, 8, ids.data_ptr(), 1, out.data_ptr(), 12345]
    for position, value in ((1, -1), (2, 2), (4, 0), (3, 0), (5, 0)):
        bad = list(args)
        bad[position] = value
        with pytest.raises(ValueError, match="mark_members"):
            helper.mark_members(*bad)
    assert helper.mark_members(*args) == 1 and out.tolist() == [False, True]


def test_the_device_path_sorted_search_matches_isin():
    """The membership used for tensors on a device (run here on CPU tensors): random ids
    with repeats, negatives and ids absent from the tokens, against torch.isin."""
    from mm_schedule.placeholders import sorted_membership

    gen = torch.Generator().manual_seed(17)
    for _ in range(100):
        pads = torch.randint(-50, 50, (int(torch.randint(1, 300, (1,), generator=gen)),), generator=gen)
        ids = torch.randint(-60, 60, (int(torch.randint(1, 700, (1,), generator=gen)),), generator=gen)
        assert torch.equal(sorted_membership(ids, pads), torch.isin(ids, pads))
