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
    assert releases.check_release("0.34.0") == "0.34.0"
    for version in ("0.24.0", "0.34.0rc1", "0.33.1.dev5+g1234"):
        with pytest.raises(vllm.UnsupportedVLLMRelease, match=rf"vLLM {re.escape(version)} .*compared: 0\.34\.0"):
            releases.check_release(version)


def test_an_unlisted_release_that_cannot_be_imported_is_refused_until_accepted(monkeypatch):
    """An unlisted release is probed on first use; one whose modules do not import (here:
    no vLLM at all behind the metadata) cannot be, and is refused by every entry point."""
    monkeypatch.setattr(releases, "installed_version", lambda: "0.99.0")
    releases.forget_installed_check()
    try:
        with pytest.raises(vllm.UnsupportedVLLMRelease, match=r"vLLM 0\.99\.0 .*could not be imported to verify it"):
            vllm.plan_rows([], [], [], [], {})
        with pytest.raises(vllm.UnsupportedVLLMRelease):
            vllm._merge_multimodal_embeddings(torch.zeros(1, 1), [torch.zeros(1, 1)], torch.ones(1, dtype=torch.bool))
        vllm.accept_release("0.99.0")
        assert vllm.plan_rows([], [], [], [], {}).n_rows == 0
    finally:
        releases._accepted.discard("0.99.0")
        releases.forget_installed_check()


def test_verify_without_vllm_says_so_in_one_line_and_exits_2():
    if releases.installed_version() is not None:
        pytest.skip("vLLM is installed here")
    out = subprocess.run([sys.executable, "-m", "mm_schedule.integrations.vllm.verify"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "vLLM is not installed" in lines[0], lines


def test_the_integrations_errors_are_importable_from_it():
    from mm_schedule import errors

    for name in ("EncoderCacheMiss", "UnsupportedVLLMRelease", "EmbeddingLengthMismatch", "InvalidItemError",
                 "KernelInputError", "MMScheduleError", "SegmentError"):
        cls = getattr(vllm, name)
        assert issubclass(cls, errors.MMScheduleError) and name in vllm.__all__
    assert vllm.EmbeddingLengthMismatch is errors.EmbeddingLengthMismatch


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


# -- strict where vLLM is undefined ---------------------------------------------------------


@pytest.mark.parametrize("is_embed", [
    torch.tensor([2, 0, 1, 1]),  # read as runs, it would drop position 0
    torch.tensor([0.5, 1.0, 1.0, 1.0]),
    torch.tensor([1, 1, 1, 1], dtype=torch.uint8),
])
def test_a_non_bool_is_embed_is_refused_before_anything_is_written(is_embed):
    outputs = {"a": torch.randn(4, 8)}
    inputs = torch.randn(6, 8)
    before = inputs.clone()
    with pytest.raises(InvalidItemError, match=rf"mm_hash 'a': is_embed must be a bool mask, got dtype {is_embed.dtype}"):
        vllm.plan_rows(["r"], [[feature("a", 1, 4, is_embed)]], [0], [6], outputs).merge_into(inputs)
    assert torch.equal(inputs, before)
    scheduler_output = types.SimpleNamespace(num_scheduled_tokens={"r": 6})
    requests = {"r": types.SimpleNamespace(num_computed_tokens=0, mm_features=[feature("a", 1, 4, is_embed)])}
    with pytest.raises(InvalidItemError, match="bool mask"):
        vllm.gather_mm_embeddings_v1(scheduler_output, ["r"], requests, outputs)


def test_a_meta_is_embed_is_refused_by_name():
    """A mask on the meta device has no values to find the embedding positions in."""
    outputs = {"a": torch.randn(4, 8)}
    mask = torch.ones(4, dtype=torch.bool, device="meta")
    with pytest.raises(InvalidItemError, match=r"mm_hash 'a': is_embed is a meta tensor"):
        vllm.plan_rows(["r"], [[feature("a", 0, 4, mask)]], [0], [4], outputs)


def test_a_mask_seen_before_is_checked_again_under_another_range_and_after_a_change():
    is_embed = torch.tensor([True, False, True, True])
    outputs = {"a": torch.randn(3, 8)}
    assert vllm.plan_rows(["r"], [[feature("a", 0, 4, is_embed)]], [0], [4], outputs).n_rows == 3
    for length in (3, 5):  # the same tensor object under a range of another length
        with pytest.raises(InvalidItemError, match=rf"range's length {length}, got \(4,\)"):
            vllm.plan_rows(["r"], [[feature("a", 0, length, is_embed)]], [0], [6], outputs)
        with pytest.raises(InvalidItemError, match=rf"range's length {length}"):  # and again, not remembered
            vllm.plan_rows(["r"], [[feature("a", 0, length, is_embed)]], [0], [6], outputs)
    is_embed[1] = True  # changed in place: four embedding rows now, read again
    reqs = [("r", [feature("a", 0, 4, is_embed)], 0, 4)]
    with pytest.raises(EmbeddingLengthMismatch, match="expected 4, got 3"):
        plan(reqs, outputs)
    outputs = {"a": torch.randn(4, 8)}
    text = torch.randn(4, 8)
    assert torch.equal(plan(reqs, outputs).merge_into(text.clone()), reference(reqs, outputs, text)[2])
    is_embed.data = torch.tensor([True, True, False, True])  # storage swapped, version unchanged
    expected = reference(reqs, {"a": outputs["a"][:3]}, text)[2]
    with pytest.raises(EmbeddingLengthMismatch, match="expected 3, got 4"):
        plan(reqs, outputs)
    assert torch.equal(plan(reqs, {"a": outputs["a"][:3]}).merge_into(text.clone()), expected)
    is_embed.data = torch.ones(4)  # and a float mask put in its place: refused
    with pytest.raises(InvalidItemError, match="bool mask"):
        plan(reqs, outputs)
    is_embed.data = torch.ones(4, dtype=torch.bool)
    is_embed.resize_(5)  # resized in place under the same range: refused
    with pytest.raises(InvalidItemError, match=r"got \(5,\)"):
        plan(reqs, outputs)


def test_inference_mode_masks_are_read_every_step():
    """Tensors made under ``torch.inference_mode`` keep no version counter; a mask changed
    in place there is still read as it is now."""
    with torch.inference_mode():
        is_embed = torch.tensor([True, False, True, True])
        outputs = {"a": torch.randn(3, 8)}
        reqs = [("r", [feature("a", 0, 4, is_embed)], 0, 4)]
        text = torch.randn(4, 8)
        assert torch.equal(plan(reqs, outputs).merge_into(text.clone()), reference(reqs, outputs, text)[2])
        is_embed[1] = True
        with pytest.raises(EmbeddingLengthMismatch, match="expected 4, got 3"):
            plan(reqs, outputs)
        outputs = {"a": torch.randn(4, 8)}
        assert torch.equal(plan(reqs, outputs).merge_into(text.clone()), reference(reqs, outputs, text)[2])
    assert is_embed.is_inference()


@pytest.mark.parametrize("seed", range(300))
def test_unsorted_features_always_raise(seed):
    """Whatever window the step reads, a request whose features are out of offset order is
    refused (vLLM bisects the list for the window, which needs that order)."""
    rng = random.Random(seed)
    n = rng.randint(2, 6)
    feats, pos, outputs = [], 0, {}
    for k in range(n):
        length = rng.randint(1, 6)
        feats.append(feature(f"f{k}", pos, length))
        outputs[f"f{k}"] = torch.randn(length, 4)
        pos += length + rng.randint(0, 3)
    i = rng.randrange(n - 1)
    feats[i], feats[i + 1] = feats[i + 1], feats[i]  # one inversion, anywhere
    done = rng.randint(0, pos)
    count = rng.randint(1, pos + 2 - done)
    with pytest.raises(InvalidItemError, match="not sorted by offset"):
        vllm.plan_rows(["r"], [feats], [done], [count], outputs)


def test_malformed_ranges_outside_the_window_are_refused():
    outputs = {"a": torch.randn(2, 4), "b": torch.randn(2, 4)}
    for bad in (feature("b", 10, 0), feature("b", 10, -2)):
        with pytest.raises(InvalidItemError, match=r"mm_hash 'b': placeholder range offset 10"):
            vllm.plan_rows(["r"], [[feature("a", 0, 2), bad]], [0], [3], outputs)


# A range at positions [10, 16) whose embedding positions are 12 and 13 only.
TEXT_AROUND = torch.tensor([False, False, True, True, False, False])


@pytest.mark.parametrize("window, needs", [
    ((10, 12), False), ((10, 13), True),  # the leading text positions, then one more
    ((14, 16), False), ((13, 16), True),  # the trailing ones, then one before
    ((0, 12), False), ((0, 13), True),  # a window from before the range to its boundary
    ((14, 30), False), ((13, 30), True),  # and from its boundary past the range
    ((11, 12), False), ((12, 13), True), ((13, 14), True), ((14, 15), False),
    ((0, 30), True), ((10, 16), True),
    ((0, 30, "no embedding position"), False), ((12, 14, "no embedding position"), False),
])
def test_a_window_of_only_text_positions_needs_no_encoder_output(window, needs):
    first, last, *no_rows = window
    feats = [feature("img", 10, 6, torch.zeros(6, dtype=torch.bool) if no_rows else TEXT_AROUND)]
    if needs:
        with pytest.raises(vllm.EncoderCacheMiss, match="mm_hash 'img'"):
            vllm.plan_rows(["r"], [feats], [first], [last - first], {})
    else:
        step = vllm.plan_rows(["r"], [feats], [first], [last - first], {})
        assert step.n_rows == 0 and not step.is_mm_embed().any()
    outputs = {"img": torch.randn(0 if no_rows else 2, 4)}
    reqs = [("r", feats, first, last - first)]
    text = torch.randn(last - first, 4)
    rows, mask, merged = reference(reqs, outputs, text)
    step = plan(reqs, outputs)
    assert step.n_rows == (0 if rows is None else rows.shape[0]) and (step.n_rows > 0) == needs
    assert torch.equal(step.is_mm_embed(), mask) and torch.equal(step.merge_into(text.clone()), merged)


def test_negated_views_are_copied_with_their_values(copy_backend):
    base = {"a": torch.randn(4, 8), "b": torch.randn(3, 8)}
    outputs = {"a": torch._neg_view(base["a"]), "b": base["b"]}
    assert outputs["a"].is_neg()
    reqs = [("r", [feature("a", 1, 4), feature("b", 6, 3)], 0, 10)]
    text = torch.randn(10, 8)
    rows, mask, merged = reference(reqs, {"a": -base["a"], "b": base["b"]}, text)
    step = plan(reqs, outputs)
    assert torch.equal(step.merge_into(torch.full_like(text, float("nan")).copy_(text)), merged)
    out = torch.full((rows.shape[0], 8), float("nan"))
    assert torch.equal(step.gather(out=out), rows)
    assert torch.equal(vllm._merge_multimodal_embeddings(text.clone(), [outputs["a"], outputs["b"]], mask), merged)
    # A negated destination: the drop-in merge writes its values (vLLM's boolean index);
    # the fused merge and gather(out=) refuse it rather than write its bytes.
    negated = torch._neg_view(text.clone())  # holds -text
    expected = reference(reqs, {"a": -base["a"], "b": base["b"]}, -text)[2]
    assert torch.equal(vllm._merge_multimodal_embeddings(negated, [-base["a"], base["b"]], mask), expected)
    for call in (lambda: step.merge_into(torch._neg_view(text.clone())),
                 lambda: step.gather(out=torch._neg_view(torch.zeros(rows.shape[0], 8)))):
        with pytest.raises(KernelInputError, match="negated view"):
            call()


def test_conjugated_views_are_refused():
    conj = torch.randn(4, 8, dtype=torch.complex64).conj()
    assert conj.is_conj()
    with pytest.raises(KernelInputError, match="floating point"):
        vllm.plan_rows(["r"], [[feature("a", 0, 4)]], [0], [4], {"a": conj})
    with pytest.raises(KernelInputError, match="floating-point rows"):
        vllm._merge_multimodal_embeddings(torch.zeros(4, 8), [conj], torch.ones(4, dtype=torch.bool))
