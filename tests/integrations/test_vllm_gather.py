"""The vLLM integration on its own: gather, fused merge and drop-in merge against an
independent per-position reference, on fresh random steps (chunked windows that cut
items, ``is_embed`` masks, shared items, decode requests), and every bad input's error.
vLLM's own code is compared in ``test_vllm_vs_wheel.py``; here the structures are plain
objects with vLLM's attribute names."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import types

import pytest
import torch

from mm_schedule.errors import EmbeddingLengthMismatch, InvalidItemError, KernelInputError
from mm_schedule.integrations import vllm
from mm_schedule.integrations.vllm import releases


def feature(key: str, offset: int, length: int, is_embed=None):
    position = types.SimpleNamespace(offset=offset, length=length, is_embed=is_embed)
    return types.SimpleNamespace(identifier=key, mm_position=position, modality="image", data=None)


def random_step(seed: int, dtype=torch.float32, hidden: int = 16):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    outputs, pool, reqs = {}, [], []
    for r in range(rng.randint(1, 5)):
        pos, feats = rng.randint(0, 3), []
        for _ in range(rng.randint(0, 4)):
            if pool and rng.random() < 0.3:
                key, length, is_embed = rng.choice(pool)
            else:
                length = rng.randint(1, 20)
                is_embed = (torch.rand(length, generator=gen) < 0.6) if rng.random() < 0.5 else None
                key = f"h{seed}-{len(pool)}"
                rows = length if is_embed is None else int(is_embed.sum())
                outputs[key] = torch.randn(rows, hidden, generator=gen).to(dtype)
                pool.append((key, length, is_embed))
            feats.append(feature(key, pos, length, is_embed))
            pos += length + rng.randint(0, 3)
        prompt = pos + 1
        done = rng.randint(0, prompt - 1)
        reqs.append((f"r{r}", feats, done, rng.randint(1, prompt - done)))
    return reqs, outputs


def reference(reqs, outputs, text):
    """Position by position: a token of the window inside a placeholder range whose
    ``is_embed`` is true there takes the encoder row numbered by the true positions before
    it. Returns (packed rows in request/item/position order, mask, merged)."""
    merged, mask, packed = text.clone(), torch.zeros(text.shape[0], dtype=torch.bool), []
    row0 = 0
    for _, feats, done, count in reqs:
        for f in feats:
            p = f.mm_position
            embed = [True] * p.length if p.is_embed is None else p.is_embed.tolist()
            for k in range(p.length):
                position = p.offset + k
                if done <= position < done + count and embed[k]:
                    out_row = sum(embed[:k])
                    token = row0 + position - done
                    merged[token] = outputs[f.identifier][out_row].to(text.dtype)
                    mask[token] = True
                    packed.append(outputs[f.identifier][out_row])
        row0 += count
    rows = torch.stack(packed) if packed else None
    return rows, mask, merged


def plan(reqs, outputs, **kwargs):
    return vllm.plan_rows([r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs],
                          [r[3] for r in reqs], outputs, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(40))
def test_gather_mask_and_merges_match_the_per_position_reference(seed, dtype):
    reqs, outputs = random_step(seed + 1000 * (dtype == torch.bfloat16), dtype)
    n_tokens = sum(r[3] for r in reqs)
    text = torch.randn(n_tokens, 16).to(dtype)
    rows, mask, merged = reference(reqs, outputs, text)
    step = plan(reqs, outputs)
    assert step.n_tokens == n_tokens and step.n_rows == (0 if rows is None else rows.shape[0])
    got_mask = step.is_mm_embed()
    assert got_mask.dtype == torch.bool and torch.equal(got_mask, mask)
    if rows is not None:
        out = torch.full((rows.shape[0] + 3, 16), float("nan"), dtype=dtype)
        assert step.gather(out=out) is out
        assert torch.equal(out[: rows.shape[0]], rows) and out[rows.shape[0]:].isnan().all()
        assert torch.equal(step.gather(), rows)
    assert torch.equal(step.merge_into(text.clone()), merged)
    embeds = [] if rows is None else list(rows.split([1] * rows.shape[0]))  # nested pieces, as vLLM passes
    assert torch.equal(vllm._merge_multimodal_embeddings(text.clone(), embeds, mask), merged)


def test_merge_into_casts_and_leaves_text_rows_alone():
    reqs, outputs = random_step(7, torch.bfloat16)
    text = torch.randn(sum(r[3] for r in reqs), 16, dtype=torch.float32)
    _, mask, merged = reference(reqs, outputs, text)
    got = plan(reqs, outputs).merge_into(text.clone())
    assert got.dtype == torch.float32 and torch.equal(got, merged)
    assert torch.equal(got[~mask], text[~mask])


def test_mixed_encoder_dtypes_are_cast_to_the_destination():
    outputs = {"a": torch.randn(4, 8), "b": torch.randn(3, 8, dtype=torch.bfloat16)}
    reqs = [("r", [feature("a", 0, 4), feature("b", 5, 3)], 0, 9)]
    text = torch.randn(9, 8, dtype=torch.bfloat16)
    _, _, merged = reference(reqs, outputs, text)
    assert torch.equal(plan(reqs, outputs).merge_into(text.clone()), merged)
    assert plan(reqs, outputs).gather().dtype == torch.float32  # promoted, as torch.cat would


def test_query_start_loc_and_decode_requests_follow_the_runner():
    outputs = {"a": torch.randn(4, 8)}
    reqs = [("decode", [feature("a", 0, 4)], 9, 1), ("prefill", [feature("a", 1, 4)], 0, 6)]
    step = vllm.plan_rows(["decode", "prefill"], [r[1] for r in reqs], [9, 0], [1, 6], outputs,
                          query_start_loc=[0, 1, 7], prefill_lens=[6, 6])
    assert step.n_tokens == 7 and step.n_rows == 4
    assert step.is_mm_embed().tolist() == [False, False, True, True, True, True, False]


def test_draft_look_ahead_may_miss_only_what_only_the_shift_reaches():
    outputs = {"a": torch.randn(4, 8)}
    feats = [feature("a", 0, 4), feature("late", 6, 2)]
    step = vllm.plan_rows(["r"], [feats], [1], [5], outputs, draft_lookahead=1)  # window [2, 7)
    assert step.keys == ["a"] and step.n_rows == 2
    with pytest.raises(vllm.EncoderCacheMiss, match=r"request 'r'.*mm_hash 'late'"):
        vllm.plan_rows(["r"], [feats], [2], [5], outputs, draft_lookahead=1)


def test_missing_encoder_output_names_request_and_hash():
    with pytest.raises(vllm.EncoderCacheMiss, match=r"request 'req-2'.*mm_hash 'img-9'.*offset 3, length 4") as err:
        vllm.plan_rows(["req-2"], [[feature("img-9", 3, 4)]], [0], [8], {})
    assert isinstance(err.value, RuntimeError) and err.value.mm_hash == "img-9"


def test_row_count_mismatch_names_request_hash_and_counts():
    with pytest.raises(EmbeddingLengthMismatch, match=r"request r1, item hash img: encoder output rows: expected 4,"
                                                       r" got 5"):
        vllm.plan_rows(["r1"], [[feature("img", 0, 4)]], [0], [4], {"img": torch.randn(5, 8)})
    is_embed = torch.tensor([True, False, True, True])
    with pytest.raises(EmbeddingLengthMismatch, match="expected 3, got 4"):
        vllm.plan_rows(["r1"], [[feature("img", 0, 4, is_embed)]], [0], [4], {"img": torch.randn(4, 8)})


@pytest.mark.parametrize("bad, message", [
    (torch.randn(4, 8, 2), r"\[rows, 8\]|\[rows, hidden\]"),
    (torch.randn(4, 7), r"\[rows, 8\]"),
    (torch.ones(4, 8, dtype=torch.int32), "floating point"),
    ([[0.0] * 8] * 4, "list"),
])
def test_bad_encoder_outputs_are_refused(bad, message):
    outputs = {"ok": torch.randn(2, 8), "bad": bad}
    feats = [feature("ok", 0, 2), feature("bad", 2, 4)]
    with pytest.raises(KernelInputError, match=message):
        vllm.plan_rows(["r"], [feats], [0], [6], outputs)


def test_malformed_placeholders_are_refused():
    outputs = {"a": torch.randn(4, 8), "b": torch.randn(4, 8)}
    with pytest.raises(InvalidItemError, match="not sorted"):
        vllm.plan_rows(["r"], [[feature("a", 5, 4), feature("b", 0, 4)]], [0], [10], outputs)
    with pytest.raises(InvalidItemError, match="is_embed must be a 1-D mask of the range's length 4"):
        vllm.plan_rows(["r"], [[feature("a", 0, 4, torch.ones(3, dtype=torch.bool))]], [0], [4], outputs)
    for offset, length in ((-1, 4), (0, 0)):
        with pytest.raises(InvalidItemError, match=rf"mm_hash 'a': placeholder range offset {offset}, length {length}"):
            vllm.plan_rows(["r"], [[feature("a", offset, length)]], [0], [4], outputs)
    with pytest.raises(InvalidItemError, match="overlap the previous request"):
        vllm.plan_rows(["r", "s"], [[], []], [0, 0], [4, 4], outputs, query_start_loc=[0, 2])
    with pytest.raises(InvalidItemError, match="num_scheduled_tokens has 1 entries for 2 requests"):
        vllm.plan_rows(["r", "s"], [[], []], [0, 0], [4], outputs)


def test_overlapping_ranges_gather_like_vllm_but_refuse_the_fused_merge():
    outputs = {"video": torch.randn(3, 8), "audio": torch.randn(2, 8)}
    video = feature("video", 0, 5, torch.tensor([True, False, True, False, True]))
    audio = feature("audio", 1, 3, torch.tensor([True, False, True]))
    step = vllm.plan_rows(["r"], [[video, audio]], [0], [5], outputs)
    assert torch.equal(step.gather(), torch.cat([outputs["video"], outputs["audio"]]))
    assert step.is_mm_embed().all()  # OR-ed, as vLLM does
    with pytest.raises(InvalidItemError, match="'video' and 'audio' overlap"):
        step.merge_into(torch.zeros(5, 8))


def test_destinations_are_checked():
    step = vllm.plan_rows(["r"], [[feature("a", 0, 4)]], [0], [6], {"a": torch.randn(4, 8)})
    with pytest.raises(KernelInputError, match=r"at least \[6, 8\]"):
        step.merge_into(torch.zeros(5, 8))
    with pytest.raises(KernelInputError, match="contiguous"):
        step.merge_into(torch.zeros(8, 6).t())
    with pytest.raises(KernelInputError, match=r"\[tokens, hidden\]"):
        step.merge_into(torch.zeros(1, 6, 8))
    with pytest.raises(KernelInputError, match=r"at least \[4, 8\]"):
        step.gather(out=torch.zeros(3, 8))


def test_drop_in_merge_refuses_a_count_mismatch_before_writing():
    inputs = torch.randn(6, 4)
    before = inputs.clone()
    mask = torch.tensor([False, True, True, True, False, False])
    with pytest.raises(EmbeddingLengthMismatch, match=r"expected 3, got 4 .*2 \+ 2 = 4 rows to 3 placeholders") as err:
        vllm._merge_multimodal_embeddings(inputs, [torch.randn(2, 4), torch.randn(2, 4)], mask)
    assert isinstance(err.value, ValueError) and torch.equal(inputs, before)
    assert vllm._merge_multimodal_embeddings(inputs, [], mask) is inputs and torch.equal(inputs, before)
    with pytest.raises(KernelInputError, match=r"bool mask, got dtype torch\.int64"):
        vllm._merge_multimodal_embeddings(inputs, [torch.randn(3, 4)], mask.long())


def test_public_merge_by_placeholder_ids():
    ids = torch.tensor([5, 9, 9, 1, 7, 9])
    embeds = torch.randn(6, 4)
    rows = torch.randn(3, 4)
    expected = embeds.clone()
    expected[ids == 9] = rows
    assert torch.equal(vllm.merge_multimodal_embeddings(ids, embeds.clone(), rows, 9), expected)
    expected = embeds.clone()
    expected[torch.isin(ids, torch.tensor([7, 9]))] = torch.randn(4, 4)
    four = expected[torch.isin(ids, torch.tensor([7, 9]))]
    assert torch.equal(vllm.merge_multimodal_embeddings(ids, embeds.clone(), [four], [7, 9]), expected)


def test_non_contiguous_inputs_embeds_take_vllms_boolean_index():
    inputs = torch.randn(4, 6).t()  # [6, 4], not contiguous
    mask = torch.tensor([True, False, True, True, False, False])
    rows = torch.randn(3, 4)
    expected = inputs.clone()
    expected[mask] = rows
    assert torch.equal(vllm._merge_multimodal_embeddings(inputs, [rows], mask), expected)


def test_v1_and_v2_shaped_entry_points_agree():
    reqs, outputs = random_step(11)
    n_tokens = sum(r[3] for r in reqs)
    text = torch.randn(n_tokens, 16)
    _, mask, merged = reference(reqs, outputs, text)
    ids = [r[0] for r in reqs]
    scheduler_output = types.SimpleNamespace(num_scheduled_tokens={r[0]: r[3] for r in reqs})
    requests = {r[0]: types.SimpleNamespace(num_computed_tokens=r[2], mm_features=r[1]) for r in reqs}
    rows_v1, mask_v1 = vllm.gather_mm_embeddings_v1(scheduler_output, ids, requests, outputs)
    cache = types.SimpleNamespace(mm_features={r[0]: r[1] for r in reqs}, encoder_outputs=outputs)
    starts = [0]
    for r in reqs:
        starts.append(starts[-1] + r[3])
    big = [10**6] * len(reqs)
    rows_v2, mask_v2 = vllm.gather_mm_embeddings(cache, ids, n_tokens + 2, [r[3] for r in reqs], starts, big,
                                                 [r[2] for r in reqs])
    assert mask_v1.dtype == mask_v2.dtype == torch.bool
    assert torch.equal(mask_v1, mask) and torch.equal(mask_v2[:n_tokens], mask) and mask_v2.shape[0] == n_tokens + 2
    for rows in (rows_v1, rows_v2):
        assert torch.equal(vllm._merge_multimodal_embeddings(text.clone(), rows, mask), merged)


def test_release_check(monkeypatch):
    assert releases.check_release("0.33.0+cu129") == "0.33.0"
    for version in ("0.24.0", "0.34.0rc1", "0.33.1.dev5+g1234"):
        with pytest.raises(vllm.UnsupportedVLLMRelease, match=rf"vLLM {re.escape(version)} .*supported: 0\.33\.0"):
            releases.check_release(version)
    monkeypatch.setattr(releases, "installed_version", lambda: "0.99.0")
    releases.installed_release_checked.cache_clear()
    try:
        with pytest.raises(vllm.UnsupportedVLLMRelease, match="accept_release"):
            vllm.plan_rows([], [], [], [], {})
        with pytest.raises(vllm.UnsupportedVLLMRelease):
            vllm._merge_multimodal_embeddings(torch.zeros(1, 1), [torch.zeros(1, 1)], torch.ones(1, dtype=torch.bool))
        vllm.accept_release("0.99.0")
        assert vllm.plan_rows([], [], [], [], {}).n_rows == 0
    finally:
        releases._accepted.discard("0.99.0")
        releases.installed_release_checked.cache_clear()


def test_importing_the_integration_loads_neither_torch_nor_vllm():
    code = ("import sys, mm_schedule.integrations.vllm as v; v.SUPPORTED_RELEASES; v.check_release('0.33.0');"
            " print(sorted(m for m in ('torch', 'vllm', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_numpy_the_mask_and_its_runs_come_from_torch(monkeypatch):
    from mm_schedule.integrations.vllm import gather, merge

    reqs, outputs = random_step(23)
    text = torch.randn(sum(r[3] for r in reqs), 16)
    _, mask, merged = reference(reqs, outputs, text)
    with_numpy = plan(reqs, outputs)
    monkeypatch.setattr(gather, "np", None)
    monkeypatch.setattr(merge, "np", None)
    step = plan(reqs, outputs)
    assert torch.equal(step.is_mm_embed(), mask) and torch.equal(with_numpy.is_mm_embed(), mask)
    rows = step.gather()
    assert torch.equal(vllm._merge_multimodal_embeddings(text.clone(), [] if rows is None else [rows], mask), merged)
    assert rows is not None and torch.equal(rows, with_numpy.gather())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_the_kernel_writes_the_reference_rows(monkeypatch, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm device")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("the kernels must be compiled for the GPU: run with TRITON_INTERPRET=0")
    from mm_schedule.kernels.backend import refresh_backend

    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "triton")
    refresh_backend()
    try:
        for seed in range(5):
            reqs, outputs = random_step(seed + 50, dtype)
            text = torch.randn(sum(r[3] for r in reqs), 16).to(dtype)
            rows, mask, merged = reference(reqs, outputs, text)
            on_gpu = {k: v.cuda() for k, v in outputs.items()}
            step = plan(reqs, on_gpu)
            assert torch.equal(step.merge_into(text.cuda()).cpu(), merged)
            if rows is not None:
                out = torch.full((rows.shape[0], 16), float("nan"), dtype=dtype, device="cuda")
                assert torch.equal(step.gather(out=out).cpu(), rows)
                assert torch.equal(vllm._merge_multimodal_embeddings(text.cuda(), [rows.cuda()], mask).cpu(), merged)
            torch.cuda.synchronize()
    finally:
        monkeypatch.undo()
        refresh_backend()
