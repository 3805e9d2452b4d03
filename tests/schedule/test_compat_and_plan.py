import random
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch

import mm_schedule
from mm_schedule import (
    EmbeddingCache,
    Encoder,
    MMItem,
    ParallelContext,
    PerImageRequestInfo,
    RequestChunk,
    StepContext,
    acknowledge_deferred_ipc,
    embed_chunk,
    merge_chunk,
    plan_step,
)
from mm_schedule.errors import EmbeddingLengthMismatch, InvalidItemError, PrecomputedEmbeddingError

from .helpers import HIDDEN, CountingEncoder, image, naive_reference, truth


def test_import_loads_neither_torch_nor_triton():
    code = (
        "import sys, mm_schedule, mm_schedule.kernels, mm_schedule.codemods;"
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_embedding_cache_attribute_is_live():
    mm_schedule.init_mm_embedding_cache(1024)
    first = mm_schedule.embedding_cache
    from mm_schedule import embedding_cache as stale

    mm_schedule.init_mm_embedding_cache(2048)
    assert mm_schedule.embedding_cache is not first
    assert mm_schedule.embedding_cache.max_bytes == 2048
    assert stale is first  # a from-import keeps the old object: read it as an attribute


def test_per_image_request_info_fields():
    info = PerImageRequestInfo(req_idx=0, items=[], items_offset=[(0, 1)], extend_prefix_len=0, extend_seq_len=2)
    assert info.overlapping == []


@dataclass(eq=False)
class AckItem(MMItem):
    acks: list = field(default_factory=list)

    def acknowledge_deferred_cuda_ipc_feature(self, consumer_count=1):
        self.acks.append(consumer_count)


@pytest.mark.parametrize(("rank", "expected"), [(0, [4]), (1, [])])
def test_cache_hits_are_acknowledged_by_rank_zero_only(rank, expected):
    cache = EmbeddingCache(1 << 20)
    ctx = StepContext(parallel=ParallelContext(attn_tp_rank=rank, attn_tp_size=2, tp_size=4),
                      on_cache_hit=acknowledge_deferred_ipc)
    item = AckItem(hash=3, offsets=[(0, 5)], feature=torch.zeros(1))
    embed_chunk([RequestChunk(items=[item], prefix=0, extend=3)], CountingEncoder(), cache=cache, context=ctx)
    assert item.acks == []  # a miss: the encoder consumed the feature
    embed_chunk([RequestChunk(items=[item], prefix=3, extend=3)], CountingEncoder(), cache=cache, context=ctx)
    assert item.acks == expected


def test_custom_ack_hook_is_injected():
    seen = []
    ctx = StepContext(on_cache_hit=lambda items, parallel: seen.append([it.hash for it in items]))
    cache = EmbeddingCache(1 << 20)
    reqs = [RequestChunk(items=[image(1, 0, 2)], prefix=0, extend=2)]
    embed_chunk(reqs, CountingEncoder(), cache=cache, context=ctx)
    embed_chunk(reqs, CountingEncoder(), cache=cache, context=ctx)
    assert seen == [[1]]


class Untouchable:
    """A feature the planner must never look at."""

    def __getattr__(self, name):
        raise AssertionError(f"planning touched the feature ({name})")


def test_planning_touches_no_tensor_and_skips_requests_outside_their_items():
    items = [MMItem(hash=1, offsets=[(10, 19)], feature=Untouchable())]
    cache = EmbeddingCache(1 << 20)
    plan = plan_step([RequestChunk(items=items, prefix=0, extend=10)], cache)
    assert plan.sources == [] and plan.segments == [] and not plan.encoder_batches
    assert cache.stats().misses == 0  # not even a lookup
    enc = CountingEncoder()
    result = embed_chunk([RequestChunk(items=items, prefix=20, extend=5)], enc, cache=cache)
    assert result.embedding is None and enc.calls == []


def test_segment_table_layout():
    reqs = [
        RequestChunk(items=[image(1, 2, 4), image(2, 8, 3)], prefix=4, extend=6),  # rows 4-5 of 1, rows 8-9 of 2
        RequestChunk(items=[image(1, 0, 4)], prefix=0, extend=4),  # image 1 again: deduplicated
    ]
    plan = plan_step(reqs, None)
    assert [(s.key, s.rows) for s in plan.sources] == [(1, 4), (2, 3)]
    assert [(g.source, g.src_row, g.n_rows, g.packed_row, g.token_row) for g in plan.segments] == [
        (0, 2, 2, 0, 0),
        (1, 0, 2, 2, 4),
        (0, 0, 4, 4, 6),
    ]
    assert list(plan.encoder_batches) == [("IMAGE", (0, 1))]


def test_token_budget_splits_encoder_calls():
    reqs = [RequestChunk(items=[image(i, 0, 3)], prefix=0, extend=3) for i in range(5)]
    enc = CountingEncoder()
    out = embed_chunk(reqs, enc, context=StepContext(max_tokens_per_encoder_call=7)).embedding
    assert enc.calls == [[0, 1], [2, 3], [4]]
    assert torch.equal(out, naive_reference(reqs))


def test_precomputed_path():
    items = [MMItem(hash=i, offsets=[(2 * i, 2 * i + 1)], precomputed_embeddings=truth(i, 2)) for i in range(3)]
    req = RequestChunk(items=items, prefix=1, extend=4)
    enc = CountingEncoder()
    out = embed_chunk([req], enc).embedding
    assert enc.calls == []
    assert torch.equal(out, naive_reference([req]))


def test_mixed_precomputed_is_refused():
    a = MMItem(hash=1, offsets=[(0, 1)], precomputed_embeddings=truth(1, 2))
    b = MMItem(hash=2, offsets=[(0, 1)], feature=torch.zeros(1))
    reqs = [RequestChunk(items=[a], prefix=0, extend=2), RequestChunk(items=[b], prefix=0, extend=2)]
    with pytest.raises(PrecomputedEmbeddingError, match=r"request 0 .* request 1") as info:
        embed_chunk(reqs, CountingEncoder())
    assert isinstance(info.value, NotImplementedError)


def test_precomputed_with_wrong_rows_raises():
    item = MMItem(hash=5, offsets=[(0, 3)], precomputed_embeddings=truth(5, 3))
    with pytest.raises(EmbeddingLengthMismatch, match=r"item hash 5.*expected 4, got 3"):
        embed_chunk([RequestChunk(items=[item], prefix=0, extend=4)], CountingEncoder())


@pytest.mark.parametrize(
    ("items", "offsets", "message"),
    [
        ([MMItem(hash=None, offsets=[(0, 1)])], None, "no hash"),
        ([image(1, 0, 4), image(2, 2, 4)], None, "not sorted and disjoint"),
        ([MMItem(hash=1, offsets=[(5, 3)])], None, "malformed span"),
        ([MMItem(hash=1, offsets=[])], None, "no offsets"),
        ([image(1, 0, 4)], [(0, 4)], "differ"),
    ],
)
def test_invalid_items_are_refused(items, offsets, message):
    with pytest.raises(InvalidItemError, match=message):
        plan_step([RequestChunk(items=items, prefix=0, extend=8, offsets=offsets)], None)


def test_multi_modality_fused_merge_in_position_order():
    img = image(1, 1, 3)
    aud = image(2, 5, 2, modality="AUDIO")
    vid = MMItem(modality="VIDEO", hash=3, offsets=[(8, 9), (11, 12)], feature=torch.zeros(1))
    req = RequestChunk(items=[aud, img, vid], prefix=0, extend=14, row_offset=2)
    encs = {"IMAGE": CountingEncoder(), "AUDIO": CountingEncoder(as_list=True), "VIDEO": CountingEncoder()}
    embeds = torch.full((20, HIDDEN), float("nan"))
    merge_chunk(embeds, [req], encs)
    ref = naive_reference([RequestChunk(items=[img, aud, vid], prefix=0, extend=14)])
    positions = [1, 2, 3, 5, 6, 8, 9, 11, 12]
    assert torch.equal(embeds[[2 + p for p in positions]], ref)
    untouched = [r for r in range(20) if r - 2 not in positions]
    assert torch.isnan(embeds[untouched]).all()
    assert [len(e.calls) for e in encs.values()] == [1, 1, 1]


def test_fused_merge_with_encoders_of_different_dtypes():
    img, aud = image(1, 0, 3), image(2, 4, 2, modality="AUDIO")
    req = RequestChunk(items=[img, aud], prefix=0, extend=6)

    def bf16_encoder(items):
        return torch.cat([truth(it.hash, 3) for it in items]).to(torch.bfloat16)

    embeds = torch.full((6, HIDDEN), float("nan"), dtype=torch.bfloat16)
    merge_chunk(embeds, [req], {"IMAGE": bf16_encoder, "AUDIO": CountingEncoder()})
    assert torch.equal(embeds[[0, 1, 2]], truth(1, 3).to(torch.bfloat16))
    assert torch.equal(embeds[[4, 5]], truth(2, 2).to(torch.bfloat16))
    assert torch.isnan(embeds[3].float()).all()


def test_missing_encoder_for_modality():
    req = RequestChunk(items=[image(1, 0, 2, modality="AUDIO")], prefix=0, extend=2)
    with pytest.raises(InvalidItemError, match="no encoder given for modality AUDIO"):
        embed_chunk([req], {"IMAGE": CountingEncoder()})


class FakeFeature:
    def __init__(self):
        self.device = "meta-device"
        self.moved_to = None

    def to(self, device, non_blocking=False):
        self.moved_to = (device, non_blocking)
        return self


def test_features_are_moved_only_when_the_encoder_asks():
    """Moving features is the encoder's own choice: a bare callable's items are never
    touched; ``Encoder(fn, move_features=True)`` gets them moved to the step's device."""
    feat = FakeFeature()
    req = RequestChunk(items=[MMItem(hash=1, offsets=[(0, 1)], feature=feat)], prefix=0, extend=2)
    embed_chunk([req], CountingEncoder(), device=torch.device("cpu"))
    assert feat.moved_to is None

    feat2 = FakeFeature()
    req2 = RequestChunk(items=[MMItem(hash=2, offsets=[(0, 1)], feature=feat2)], prefix=0, extend=2)
    embed_chunk([req2], Encoder(CountingEncoder(), move_features=True), device=torch.device("cpu"))
    assert feat2.moved_to == (torch.device("cpu"), True)
    assert req2.items[0].feature is feat2  # FakeFeature.to returns itself


def test_with_misses_re_encodes_hits_another_rank_missed():
    """The seam for ranks agreeing on misses: a hit turned into a miss is encoded again,
    batched with the other misses, and is no longer acknowledged as a hit."""
    cache = EmbeddingCache(1 << 20)
    shared = image(1, 0, 3)
    embed_chunk([RequestChunk(items=[shared], prefix=0, extend=3)], CountingEncoder(), cache=cache)
    reqs = [RequestChunk(items=[shared, image(2, 4, 2)], prefix=0, extend=6)]
    plan = plan_step(reqs, cache, max_tokens_per_encoder_call=100)
    assert [s.status for s in plan.sources] == [mm_schedule.SourceKind.HIT, mm_schedule.SourceKind.MISS]
    assert plan.hit_items == [shared]
    agreed = plan.with_misses([0])
    assert list(agreed.encoder_batches) == [("IMAGE", (0, 1))] and agreed.hit_items == []
    assert plan.kinds[0] is mm_schedule.SourceKind.HIT  # the original plan is unchanged
    from mm_schedule.scheduler import run_packed

    enc = CountingEncoder()
    got = run_packed(agreed, enc, cache, StepContext()).embedding
    assert enc.calls == [[1, 2]] and torch.equal(got, naive_reference(reqs))


def test_flat_and_general_planners_build_the_same_plan():
    """On steps the flat planner takes, the general planner (which it defers to for
    everything else) must build exactly the same plan."""
    import random

    from mm_schedule.plan.flat import plan_flat
    from mm_schedule.plan.general import plan_general

    rng = random.Random("flat vs general")
    compared = 0
    for _ in range(200):
        item_lists, prefixes, extends, offsets = [], [], [], []
        for r in range(rng.randint(1, 5)):
            pos, items = rng.randint(0, 3), []
            for _ in range(rng.randint(0, 4)):
                length = rng.randint(1, 6)
                h = rng.choice([rng.randint(1, 5), 100 * r + len(items) + 10])
                items.append(MMItem(hash=h, offsets=[(pos, pos + length - 1)], feature=torch.zeros(1)))
                pos += length + rng.randint(0, 2)
            item_lists.append(items)
            prefixes.append(rng.randint(0, 6))
            extends.append(rng.randint(0, 10))
            offsets.append([it.offsets[0] for it in items] if rng.random() < 0.5 else None)
        rows = [None] * len(item_lists)
        flat = plan_flat(item_lists, prefixes, extends, offsets, rows, 5)
        general = plan_general(item_lists, prefixes, extends, offsets, rows, 5)
        if flat is None:  # one hash with two lengths: only the general planner takes it
            continue
        flat, general = flat.with_lookups(None), general.with_lookups(None)
        for column in ("kinds", "keys", "rows", "requests", "modalities", "seg_source", "seg_src_row", "seg_rows",
                       "seg_packed_row", "seg_token_row", "seg_request", "encoder_batches"):
            assert list(getattr(flat, column)) == list(getattr(general, column)), column
        assert (flat.n_rows, flat.n_tokens) == (general.n_rows, general.n_tokens)
        compared += 1
    assert compared > 150


def _two_request_step(rng):
    """Two one-image requests in SGLang's argument layout, with random spans and rows."""
    spans = [(rng.randint(0, 2), None), (rng.randint(0, 2), None)]
    spans = [(s, s + rng.randint(1, 4)) for s, _ in spans]
    items = [MMItem("IMAGE", rng.getrandbits(40), [span], pad_value=1000 + r) for r, span in enumerate(spans)]
    ids = []
    for r, (s, e) in enumerate(spans):
        row = [7] * (e + 2)
        row[s : e + 1] = [1000 + r] * (e - s + 1)
        ids += row
    extends = [e + 2 for _, e in spans]
    rows = {it.hash: torch.randn(e - s + 1, HIDDEN) for it, (s, e) in zip(items, spans)}
    return items, torch.tensor(ids), torch.tensor([1000, 1001]), extends, [[span] for span in spans], rows


def test_sglang_lists_shorter_than_the_requests():
    """SGLang reads a request past the end of ``extend_length`` as extending nothing; an
    ``items_offset_list`` too short for a request that has items is refused, naming it."""
    rng = random.Random()
    items, ids, pads, extends, offsets, rows = _two_request_step(rng)

    def encoder(batch):
        return [rows[it.hash] for it in batch]

    mm_schedule.init_mm_embedding_cache(1 << 20)
    first = ids[: extends[0]]
    emb, mask, _ = mm_schedule.get_embedding_and_mask(encoder, items, pads, first, [0, 1, 2], [0, 0], extends[:1],
                                                      offsets)
    assert torch.equal(emb, rows[items[0].hash])
    assert int(mask.sum()) == rows[items[0].hash].shape[0]
    with pytest.raises(InvalidItemError, match=r"request 1: items_offset_list has 1 entries"):
        mm_schedule.get_embedding_and_mask(encoder, items, pads, ids, [0, 1, 2], [0, 0], extends, offsets[:1])
    # A request without items needs no offsets entry.
    emb, _, _ = mm_schedule.get_embedding_and_mask(encoder, items[:1], pads[:1], first, [0, 1, 1], [0, 0],
                                                   [extends[0], 3], offsets[:1])
    assert torch.equal(emb, rows[items[0].hash])


def test_sglang_arguments_given_as_tuples_are_planned_as_lists():
    rng = random.Random()
    items, ids, pads, extends, offsets, rows = _two_request_step(rng)

    def encoder(batch):
        return [rows[it.hash] for it in batch]

    want = torch.cat([rows[it.hash] for it in items])
    for args in ((tuple(items), [0, 1, 2]), (items, (0, 1, 2)), (tuple(items), (0, 1, 2))):
        mm_schedule.init_mm_embedding_cache(1 << 20)
        emb, mask, _ = mm_schedule.get_embedding_and_mask(encoder, args[0], pads, ids, args[1], (0, 0),
                                                          tuple(extends), tuple(offsets))
        assert torch.equal(emb, want) and int(mask.sum()) == want.shape[0]
