"""The transformers adapters on real architectures (tiny random configs): items found in
processor-like inputs, rows and logits against the model's own merge and forward,
encoder calls and cache hits counted by hand, and the input errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from serving import RecordingEncoder
from tiny_vlms import KINDS, TinyVLM, reorder_tolerance

from mm_schedule import EmbeddingCache, RequestChunk, merge_chunk
from mm_schedule.errors import InvalidItemError, UnsupportedModelError
from mm_schedule.integrations.transformers import VisionAdapter


@pytest.fixture(scope="module", params=KINDS)
def vlm(request):
    return TinyVLM(request.param)


def _prefill(adapter, cache, requests, steps, encoder=None):
    """Run ``steps`` (each a list of (request index, prefix, extend)) through
    ``merge_chunk`` (encoder: ``adapter`` unless given); returns every request's assembled
    embeddings, the step reports and the items."""
    ids = [r["input_ids"][0] for r in requests]
    items = [adapter.items(r) for r in requests]
    done = [[] for _ in requests]
    reports = []
    for step in steps:
        embeds = adapter.embed_text(torch.cat([ids[i][p : p + e] for i, p, e in step]))
        result = merge_chunk(embeds, [RequestChunk(items[i], p, e) for i, p, e in step], encoder or adapter, cache=cache)
        reports.append(result.report)
        for (i, _, _), piece in zip(step, embeds.split([e for _, _, e in step])):
            done[i].append(piece)
    return [torch.cat(parts) for parts in done], reports, items


def test_chunked_prefill_matches_the_models_own_merge_and_forward(vlm):
    gen = torch.Generator().manual_seed(11)
    a, b = vlm.image(gen, (1, 4, 4)), vlm.image(gen, (1, 2, 6))
    r0 = vlm.prompt([5, a, 7, b, 3], gen)
    r1 = vlm.prompt([4, a, 6], gen)  # shares image a with r0, joins at step 2
    adapter = VisionAdapter(vlm.model, model_id="tiny-test")
    items0 = adapter.items(r0)
    # Step 1 ends inside image b: both images are encoded in one call, b is cut.
    cut = items0[1].offsets[0][0] + 2
    n0, n1 = r0["input_ids"].shape[1], r1["input_ids"].shape[1]
    steps = [[(0, 0, cut)], [(0, cut, n0 - cut), (1, 0, n1)]]
    cache = EmbeddingCache(1 << 20)
    (got0, got1), reports, items = _prefill(adapter, cache, [r0, r1], steps)

    assert [(r.encoder_calls, r.items_encoded, r.cache_hits) for r in reports] == [(1, 2, 0), (0, 0, 2)]
    assert adapter.calls == 1
    assert items[1][0].hash == items0[0].hash and items0[0].hash != items0[1].hash

    want0 = vlm.reference_embeds(r0)[0]
    assert torch.equal(got0, want0)
    # r1's image rows came from the cache: exactly the rows r0's encode produced for a.
    a0, a1 = items0[0].offsets[0], items[1][0].offsets[0]
    assert torch.equal(got1[a1[0] : a1[1] + 1], want0[a0[0] : a0[1] + 1])
    text1 = r1["input_ids"][0] != items[1][0].pad_value
    assert torch.equal(got1[text1], vlm.reference_embeds(r1)[0][text1])

    with torch.no_grad():
        own = vlm.model(**r0).logits
        ours = vlm.model(inputs_embeds=got0[None], **vlm.forward_kwargs(r0)).logits
    assert torch.equal(ours, own)


def test_rows_batched_across_requests_are_copies_of_the_encode_and_agree_to_rounding(vlm):
    """Three requests' images in one encoder call: each request's rows are exactly the rows
    that call returned (assembly copies), and equal the model's own forward, which encodes
    each request's image alone, to the rounding of another batch composition."""
    gen = torch.Generator().manual_seed(14)
    prompts = [vlm.prompt([2 + i, vlm.image(gen, grid), 3], gen) for i, grid in enumerate(((1, 4, 4), (1, 2, 6), (1, 4, 8)))]
    adapter = VisionAdapter(vlm.model, model_id="m")
    recorder = RecordingEncoder(adapter)
    step = [(i, 0, p["input_ids"].shape[1]) for i, p in enumerate(prompts)]
    got, (report,), items = _prefill(adapter, EmbeddingCache(1 << 20), prompts, [step], recorder)
    assert (report.encoder_calls, report.items_encoded) == (1, 3)
    for rows, inputs, request_items in zip(got, prompts, items):
        assert torch.equal(rows, vlm.merge_rows(inputs, recorder.request_rows(request_items))[0])
        own = vlm.reference_embeds(inputs)[0]
        torch.testing.assert_close(rows, own, rtol=0, atol=reorder_tolerance(vlm.vision, own))
        # Rows of another image would be far outside that tolerance.
        assert reorder_tolerance(vlm.vision, own) < 1e-3 * own.abs().max()


def test_items_carry_spans_grids_and_host_pixels(vlm):
    gen = torch.Generator().manual_seed(5)
    images = [vlm.image(gen, (1, 4, 4)), vlm.image(gen, (1, 2, 6)), vlm.image(gen, (1, 4, 4))]
    inputs = vlm.prompt([3, images[0], images[1], 2, images[2]], gen)
    items = VisionAdapter(vlm.model, model_id="m").items(inputs)
    ids = inputs["input_ids"][0]
    assert len(items) == 3
    for item, image in zip(items, images):
        (s, e), = item.offsets
        assert e - s + 1 == image.tokens
        assert bool((ids[s : e + 1] == item.pad_value).all())
        assert torch.equal(item.feature, image.pixels)
        if vlm.qwen:
            assert item.model_specific_data["grid_thw"].tolist() == list(image.grid)
    assert sum(e - s + 1 for it in items for s, e in it.offsets) == int((ids == items[0].pad_value).sum())


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen_videos_and_images_in_one_request(kind):
    vlm = TinyVLM(kind)
    gen = torch.Generator().manual_seed(8)
    inputs = vlm.prompt([2, vlm.image(gen, (2, 4, 4), video=True), 3, vlm.image(gen, (1, 4, 2)), 4], gen)
    adapter = VisionAdapter(vlm.model, model_id="m")
    items = adapter.items(inputs)
    assert [it.modality for it in items] == ["VIDEO", "IMAGE"]
    n = inputs["input_ids"].shape[1]
    (got,), reports, _ = _prefill(adapter, EmbeddingCache(1 << 20), [inputs], [[(0, 0, 5)], [(0, 5, n - 5)]])
    # One call per modality, each with the request's only item of it, as the model's forward
    # encodes them: the same batches, so exact.
    assert [(r.encoder_calls, r.items_encoded) for r in reports] == [(1, 1), (1, 1)]
    assert torch.equal(got, vlm.reference_embeds(inputs)[0])


def test_bf16_model_rows_and_logits_exact():
    vlm = TinyVLM("qwen2_vl")
    vlm.model.to(torch.bfloat16)
    gen = torch.Generator().manual_seed(9)
    inputs = vlm.prompt([4, vlm.image(gen, (1, 4, 4)), 5, vlm.image(gen, (1, 2, 4)), 2], gen)
    inputs["pixel_values"] = inputs["pixel_values"].to(torch.bfloat16)
    adapter = VisionAdapter(vlm.model, model_id="m")
    n = inputs["input_ids"].shape[1]
    # Step 1 ends inside the second image, so it encodes both images in one call, as the
    # model's forward does: the same batch, the same rounding, so rows and logits are exact.
    cut = adapter.items(inputs)[1].offsets[0][0] + 1
    (got,), reports, _ = _prefill(adapter, EmbeddingCache(1 << 20), [inputs], [[(0, 0, cut)], [(0, cut, n - cut)]])
    assert [(r.encoder_calls, r.items_encoded, r.cache_hits) for r in reports] == [(1, 2, 0), (0, 0, 1)]
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, vlm.reference_embeds(inputs)[0])
    with torch.no_grad():
        own = vlm.model(**inputs).logits
        ours = vlm.model(inputs_embeds=got[None], **vlm.forward_kwargs(inputs)).logits
    assert torch.equal(ours, own)
    # The model's dtype is part of the identity hashed into every item.
    assert VisionAdapter(vlm.model, model_id="m").model_id != VisionAdapter(
        TinyVLM("qwen2_vl").model, model_id="m"
    ).model_id


def test_same_pixels_under_another_grid_are_another_image():
    """Qwen pixels are patch rows: the same rows read as a 4x6 or a 6x4 grid are two
    different images. Hashing them alike would serve one's cached rows for the other."""
    vlm = TinyVLM("qwen2_vl")
    gen = torch.Generator().manual_seed(4)
    wide = vlm.image(gen, (1, 4, 6))
    tall = type(wide)(wide.pixels.clone(), wide.tokens, (1, 6, 4))
    inputs = vlm.prompt([3, wide, 4, tall, 2], gen)
    adapter = VisionAdapter(vlm.model, model_id="m")
    x, y = adapter.items(inputs)
    assert torch.equal(x.feature, y.feature) and x.hash != y.hash
    n = inputs["input_ids"].shape[1]
    cache = EmbeddingCache(1 << 20)
    # x alone first (cached), then y in a later step: a grid-blind key would hit x here.
    (got,), reports, _ = _prefill(adapter, cache, [inputs], [[(0, 0, x.offsets[0][1] + 1)], [(0, x.offsets[0][1] + 1, n - x.offsets[0][1] - 1)]])
    assert [r.cache_hits for r in reports] == [0, 0]
    sx, ex = x.offsets[0]
    sy, ey = y.offsets[0]
    # Each image alone, as each step encoded it.
    want_x, want_y = (
        vlm.own_rows({"pixel_values": image.pixels, "image_grid_thw": torch.tensor([image.grid])})["IMAGE"]
        for image in (wide, tall)
    )
    assert torch.equal(got[sx : ex + 1], want_x) and torch.equal(got[sy : ey + 1], want_y)
    assert not torch.allclose(want_x, want_y)


def test_encoder_leaves_item_pixels_alone(monkeypatch):
    """The scheduler must not move the adapter's items to the device (it would replace
    each item's host pixels with a device copy): the adapter copies its batch itself."""
    import mm_schedule.encode

    moved = []
    monkeypatch.setattr(mm_schedule.encode, "move_features_to", lambda items, device: moved.append(items))
    vlm = TinyVLM("qwen2_vl")
    gen = torch.Generator().manual_seed(2)
    inputs = vlm.prompt([3, vlm.image(gen), 3, vlm.image(gen, (1, 2, 4)), 1], gen)
    adapter = VisionAdapter(vlm.model, model_id="m")
    items = adapter.items(inputs)
    before = [(it.feature, it.feature.clone()) for it in items]
    n = inputs["input_ids"].shape[1]
    merge_chunk(adapter.embed_text(inputs["input_ids"][0]), [RequestChunk(items, 0, n)], adapter)
    assert adapter.calls == 1 and moved == []
    for item, (same, copy) in zip(items, before):
        assert item.feature is same and torch.equal(item.feature, copy)


def test_gemma3_placeholder_outside_the_vocabulary_embeds_as_the_model_does():
    vlm = TinyVLM("gemma3")
    gen = torch.Generator().manual_seed(6)
    inputs = vlm.prompt([3, vlm.image(gen), 3], gen)
    oov = vlm.model.config.text_config.vocab_size + 5
    inputs["input_ids"][inputs["input_ids"] == vlm.model.config.image_token_id] = oov
    vlm.model.config.image_token_id = oov
    adapter = VisionAdapter(vlm.model, model_id="m")
    n = inputs["input_ids"].shape[1]
    (got,), _, _ = _prefill(adapter, None, [inputs], [[(0, 0, n)]])
    with torch.no_grad():
        own = vlm.model(**inputs).logits
        ours = vlm.model(inputs_embeds=got[None], **vlm.forward_kwargs(inputs)).logits
    assert torch.equal(ours, own)


def test_batched_processor_output_splits_per_row():
    vlm = TinyVLM("llava_siglip")
    gen = torch.Generator().manual_seed(3)
    a, b, c = (vlm.image(gen) for _ in range(3))
    r0, r1 = vlm.prompt([2, a, 3, b], gen), vlm.prompt([5, c, 1], gen)
    width = max(r0["input_ids"].shape[1], r1["input_ids"].shape[1])
    pad = lambda ids: torch.cat([ids, torch.zeros(1, width - ids.shape[1], dtype=ids.dtype)], 1)  # noqa: E731
    batch = {"input_ids": torch.cat([pad(r0["input_ids"]), pad(r1["input_ids"])]),
             "pixel_values": torch.cat([r0["pixel_values"], r1["pixel_values"]])}
    adapter = VisionAdapter(vlm.model, model_id="m")
    per_row = adapter.batch_items(batch)
    assert [[it.offsets for it in row] for row in per_row] == [
        [it.offsets for it in adapter.items(r0)], [it.offsets for it in adapter.items(r1)]
    ]
    assert [it.hash for it in per_row[1]] == [it.hash for it in adapter.items(r1)]
    with pytest.raises(InvalidItemError, match="use batch_items"):
        adapter.items(batch)


def test_bad_inputs_raise_typed_errors_naming_the_problem():
    vlm = TinyVLM("qwen2_vl")
    gen = torch.Generator().manual_seed(1)
    adapter = VisionAdapter(vlm.model, model_id="m")
    inputs = vlm.prompt([2, vlm.image(gen, (1, 4, 4)), 2, vlm.image(gen, (1, 2, 2)), 2], gen)

    no_pixels = {"input_ids": inputs["input_ids"]}
    with pytest.raises(InvalidItemError, match=r"5 image placeholder tokens \(id 120\) but the inputs have no pixel_values"):
        adapter.items(no_pixels)
    no_grid = {k: v for k, v in inputs.items() if k != "image_grid_thw"}
    with pytest.raises(InvalidItemError, match="need image_grid_thw"):
        adapter.items(no_grid)
    wrong_grid = dict(inputs, image_grid_thw=torch.tensor([[1, 4, 4], [1, 2, 4]]))
    with pytest.raises(InvalidItemError, match="describes 24 patch rows, pixel_values has 20"):
        adapter.items(wrong_grid)
    # The grids add up, but the first image's run is shorter than its grid says.
    swapped = dict(inputs, image_grid_thw=torch.tensor([[1, 2, 2], [1, 4, 4]]), pixel_values=inputs["pixel_values"])
    with pytest.raises(InvalidItemError, match="image 1 needs 4 placeholder tokens"):
        adapter.items(swapped)
    odd = dict(inputs, image_grid_thw=torch.tensor([[1, 4, 4], [1, 1, 4]]), pixel_values=inputs["pixel_values"][:20])
    with pytest.raises(InvalidItemError, match=r"row \[1, 1, 4\]: height and width must be multiples of the merge size 2"):
        adapter.items(odd)
    extra = dict(inputs, input_ids=torch.cat([inputs["input_ids"], torch.tensor([[120]])], 1))
    with pytest.raises(InvalidItemError, match="all 2 images of the inputs are already placed"):
        adapter.items(extra)

    llava = VisionAdapter(TinyVLM("llava_clip").model, model_id="m")
    uneven = {"input_ids": torch.tensor([[1] + [120] * 5 + [2]]), "pixel_values": torch.zeros(2, 3, 16, 16)}
    with pytest.raises(InvalidItemError, match=r"5 image placeholder tokens .* evenly among 2 images"):
        llava.items(uneven)

    class NotAVLM(torch.nn.Module):
        config = type("Config", (), {"model_type": "bert"})()

    with pytest.raises(UnsupportedModelError, match=r"model_type 'bert'.*supported: qwen2_vl"):
        VisionAdapter(NotAVLM())


def test_the_inner_model_works_as_well_as_the_generation_wrapper(vlm):
    gen = torch.Generator().manual_seed(12)
    inputs = vlm.prompt([3, vlm.image(gen), 2, vlm.image(gen, (1, 2, 4)), 1], gen)
    outer, inner = VisionAdapter(vlm.model, model_id="m"), VisionAdapter(vlm.model.model, model_id="m")
    assert [it.hash for it in inner.items(inputs)] == [it.hash for it in outer.items(inputs)]
    n = inputs["input_ids"].shape[1]
    (got,), _, _ = _prefill(inner, None, [inputs], [[(0, 0, n)]])
    assert torch.equal(got, vlm.reference_embeds(inputs)[0])


def test_numpy_processor_output_gives_the_same_items():
    vlm = TinyVLM("qwen2_vl")
    gen = torch.Generator().manual_seed(13)
    inputs = vlm.prompt([3, vlm.image(gen), 2, vlm.image(gen, (1, 2, 4)), 1], gen)
    adapter = VisionAdapter(vlm.model, model_id="m")
    from_numpy = adapter.items({k: v.numpy() for k, v in inputs.items()})
    want = adapter.items(inputs)
    assert [(it.hash, it.offsets) for it in from_numpy] == [(it.hash, it.offsets) for it in want]
    with pytest.raises(InvalidItemError, match="no input_ids"):
        adapter.items({"pixel_values": inputs["pixel_values"]})
