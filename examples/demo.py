"""mm_schedule demo: chunked prefill of a mixed multimodal batch through a real encoder.

Five requests share a few images and a video; every step prefills at most CHUNK
tokens of each request, so images are cut by chunk boundaries. The encoder is a
SigLIP so400m-patch14 tower (2 of its 27 layers, 112 px images, 64 rows per image)
with a LLaVA projector, random weights, nothing downloaded (benchmarks/vision_encoder.py).

Each step runs twice, on two engines with their own caches that see the same batch:

* packed: ``embed_chunk`` returns the step's multimodal rows as one [rows, H] tensor;
* fused:  ``merge_chunk`` writes them straight into the step's ``input_embeds``.

Both are checked against a deliberately naive reference that encodes each request's
items one at a time, maps every placeholder position to its row, and keeps the
positions inside the window. The encoder calls, items encoded and cache hits are
checked against counts worked out independently of the scheduler.

    python examples/demo.py          # `make demo`; exits 1 if any check fails
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from vision_encoder import VisionEncoder, small_shape

from mm_schedule import (
    EmbeddingCache,
    MMItem,
    RequestChunk,
    StepContext,
    embed_chunk,
    merge_chunk,
)
from mm_schedule.plan import HIT

CHUNK = 96  # tokens of each request prefilled per step
VOCAB = 1000
PAD_BASE = 1_000_000  # placeholder ids start above the vocabulary, as SGLang's do
TOLERANCE = 1e-5  # batched and one-at-a-time encodes may round differently in the last bits
NO_IPC = StepContext(on_cache_hit=None)  # these items carry no CUDA-IPC handles to release


# -- the batch ---------------------------------------------------------------------------------


@dataclass
class Request:
    name: str
    arrives: int  # step at which it joins the batch
    length: int
    items: list[MMItem]
    input_ids: torch.Tensor = field(init=False)
    prefilled: int = 0

    def __post_init__(self) -> None:
        ids = torch.randint(0, VOCAB, (self.length,), generator=torch.Generator().manual_seed(len(self.name) + self.length))
        for item in self.items:
            for s, e in item.offsets:
                ids[s : e + 1] = item.pad_value
        self.input_ids = ids


def build_batch(encoder: VisionEncoder) -> tuple[list[Request], dict[int, str]]:
    gen = torch.Generator().manual_seed(2024)
    t = encoder.shape.tokens_per_image
    pixels = {name: encoder.random_image(gen) for name in "ABCDE"}
    hashes = {name: 0x5EED0000 + i for i, name in enumerate("ABCDEV")}

    def image(name: str, start: int) -> MMItem:
        return MMItem(
            modality="IMAGE", hash=hashes[name], offsets=[(start, start + t - 1)],
            feature=pixels[name], pad_value=PAD_BASE + hashes[name] % 1000,
        )

    # A video of three frames; 4 timestamp tokens separate the frames, so the item has
    # three spans and takes the per-request path under one combined cache key.
    frames = 3
    first, gap = 8, 4
    video = MMItem(
        modality="VIDEO", hash=hashes["V"],
        offsets=[(first + f * (t + gap), first + f * (t + gap) + t - 1) for f in range(frames)],
        feature=encoder.random_video(frames, gen), pad_value=PAD_BASE + 999,
    )
    requests = [
        Request("R0", 1, 160, [image("A", 10), image("B", 82)]),
        Request("R1", 1, 176, [image("A", 6), image("C", 100)]),  # A again: encoded once
        Request("R2", 1, first + frames * (t + gap) + 6, [video]),
        Request("R3", 1, 210, [image("D", 140)]),  # nothing to encode until step 2
        Request("R4", 2, 140, [image("B", 4), image("E", 73)]),  # arrives later; B is cached
    ]
    names = {h: n for n, h in hashes.items()}
    return requests, names


def step_chunks(requests: list[Request], step: int) -> tuple[list[Request], list[RequestChunk]]:
    active = [r for r in requests if r.arrives <= step and r.prefilled < r.length]
    chunks = [RequestChunk(items=r.items, prefix=r.prefilled, extend=min(CHUNK, r.length - r.prefilled)) for r in active]
    return active, chunks


# -- the independent reference and expectations ------------------------------------------------


def naive_rows(encoder: VisionEncoder, chunks: list[RequestChunk]) -> torch.Tensor:
    """Encode each request's items one at a time, map positions to rows, keep the window."""
    rows = []
    for chunk in chunks:
        position_row = {}
        for item in chunk.items:
            embedding = encoder.encode([item], per_item=False)
            local = 0
            for s, e in item.offsets:
                for p in range(s, e + 1):
                    position_row[p] = embedding[local]
                    local += 1
        rows += [position_row[p] for p in range(chunk.prefix, chunk.prefix + chunk.extend) if p in position_row]
    return torch.stack(rows) if rows else torch.empty(0, encoder.shape.lm_hidden)


def expected_counts(chunks: list[RequestChunk], encoded: set) -> tuple[int, int, int]:
    """(encoder calls, items encoded, cache hits) an ideal scheduler has for this step,
    given the keys encoded by earlier steps; updates ``encoded``."""

    def overlaps(item, chunk):
        return any(e >= chunk.prefix and s < chunk.prefix + chunk.extend for s, e in item.offsets)

    new_images, new_videos, hits = [], [], set()
    for chunk in chunks:
        for item in chunk.items:
            if not overlaps(item, chunk):
                continue
            # Single-span items are shared by hash across requests; a multi-span item is
            # keyed per request (combined key of the request's video items).
            key = item.hash if len(item.offsets) == 1 else ("request", tuple(it.hash for it in chunk.items))
            if key in encoded:
                hits.add(key)
            elif len(item.offsets) == 1:
                if key not in new_images:
                    new_images.append(key)
            elif key not in new_videos:
                new_videos.append(key)
    encoded.update(new_images, new_videos)
    video_items = len(new_videos)  # one video item per request here
    calls = (1 if new_images else 0) + len(new_videos)
    return calls, len(new_images) + video_items, len(hits)


def text_rows(table: torch.Tensor, active: list[Request], chunks: list[RequestChunk]) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's ``input_embeds`` before merging (text embedded, placeholders poisoned)
    and the mask of its placeholder rows."""
    ids = torch.cat([r.input_ids[c.prefix : c.prefix + c.extend] for r, c in zip(active, chunks)])
    is_mm = ids >= PAD_BASE
    embeds = table[ids.clamp(max=VOCAB - 1)]
    embeds[is_mm] = float("nan")
    return embeds, is_mm


# -- one step ------------------------------------------------------------------------------------


def describe(result, names: dict[int, str], requests: list[Request]) -> list[list[str]]:
    """Per request: which embeddings its rows came from, and how each was obtained."""
    rows: list[dict[int, int]] = [{} for _ in requests]
    spans: list[dict[int, int]] = [{} for _ in requests]
    for seg in result.plan.segments:
        rows[seg.request][seg.source] = rows[seg.request].get(seg.source, 0) + seg.n_rows
        spans[seg.request][seg.source] = spans[seg.request].get(seg.source, 0) + 1
    first_user: dict[int, int] = {}
    parts = []
    for r, per_source in enumerate(rows):
        out = []
        for src, n in per_source.items():
            source = result.plan.sources[src]
            label = "+".join(names.get(int(it.hash), "?") for it in source.items)
            if source.status == HIT:
                how = "cached"
            elif src in first_user:
                how = f"same encode as {requests[first_user[src]].name}"
            else:
                how = "encoded"
            first_user.setdefault(src, r)
            pieces = f" in {spans[r][src]} spans" if spans[r][src] > 1 else ""
            out.append(f"{label}: {n} rows{pieces} ({how})")
        parts.append(out)
    return parts


def compare(name: str, got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    if got.shape != want.shape:
        return False, f"{name}: shape {tuple(got.shape)}, reference {tuple(want.shape)}"
    if torch.equal(got, want):
        return True, f"{name}: bit-exact"
    diff = (got - want).abs().max().item()
    ok = diff <= TOLERANCE and not torch.isnan(got).any()
    return ok, f"{name}: max |diff| {diff:.2g} (tolerance {TOLERANCE:g})"


def run_step(step, requests, names, encoder, caches, table, encoded) -> bool:
    active, chunks = step_chunks(requests, step)
    print(f"\nstep {step}: {len(active)} requests, up to {CHUNK} tokens each")
    encoders = {"IMAGE": encoder, "VIDEO": lambda items: encoder.encode(items, per_item=True)}

    calls_before = encoder.calls
    packed = embed_chunk(chunks, encoders, cache=caches["packed"], context=NO_IPC)
    packed_calls = encoder.calls - calls_before
    embeds, is_mm = text_rows(table, active, chunks)
    text_before = embeds[~is_mm].clone()
    calls_before = encoder.calls
    fused = merge_chunk(embeds, chunks, encoders, cache=caches["fused"], context=NO_IPC)
    fused_calls = encoder.calls - calls_before

    parts = describe(packed, names, active)
    print(f"  {'request':<10}{'window':<13}{'mm rows':>7}   taken from")
    for index, (r, c, p) in enumerate(zip(active, chunks, parts)):
        window = f"[{c.prefix}, {c.prefix + c.extend})"
        n_rows = sum(seg.n_rows for seg in packed.plan.segments if seg.request == index)
        print(f"  {r.name:<10}{window:<13}{n_rows:>7}   {'; '.join(p) or '- (no item in this window: nothing to do)'}")

    want = expected_counts(chunks, encoded)
    print(f"\n  {'mode':<9}{'encoder calls':>14}{'items encoded':>15}{'cache hits':>12}{'rows':>7}{'segments':>10}")
    ok = True
    for mode, res, counted in (("packed", packed, packed_calls), ("fused", fused, fused_calls)):
        rep = res.report
        print(f"  {mode:<9}{rep.encoder_calls:>14}{rep.items_encoded:>15}{rep.cache_hits:>12}{rep.rows:>7}{rep.segments:>10}")
        got = (rep.encoder_calls, rep.items_encoded, rep.cache_hits)
        if got != want or counted != rep.encoder_calls:
            ok = False
            print(f"  FAIL {mode}: (calls, items, hits) = {got}, expected {want}; encoder saw {counted} calls")
    print(f"  {'expected':<9}{want[0]:>14}{want[1]:>15}{want[2]:>12}")

    reference = naive_rows(encoder, chunks)
    checks = [compare("packed rows", packed.embedding if packed.embedding is not None else reference[:0], reference)]
    checks.append(compare("fused placeholder rows", embeds[is_mm], reference))
    checks.append((torch.equal(embeds[~is_mm], text_before), "fused text rows untouched"))
    for passed, what in checks:
        print(f"  {'PASS' if passed else 'FAIL'}  {what}")
        ok &= passed
    for r, c in zip(active, chunks):
        r.prefilled += c.extend
    return ok


def main() -> int:
    started = time.perf_counter()
    torch.manual_seed(0)
    shape = small_shape()
    encoder = VisionEncoder(shape)
    print("mm_schedule demo: chunked prefill with cross-request encoder batching")
    print(f"encoder: {shape.describe()}")
    print(f"         random weights, built in {time.perf_counter() - started:.1f} s")
    requests, names = build_batch(encoder)
    print("\nbatch (positions are prompt tokens; image spans are 64 tokens):")
    for r in requests:
        spans = ", ".join(
            f"{names[it.hash]}{' (video, ' + str(len(it.offsets)) + ' frames)' if len(it.offsets) > 1 else ''}"
            f" at {it.offsets[0][0]}..{it.offsets[-1][1]}"
            for it in r.items
        )
        joins = f", joins at step {r.arrives}" if r.arrives > 1 else ""
        print(f"  {r.name}: {r.length} tokens{joins}: {spans}")

    caches = {"packed": EmbeddingCache(64 << 20), "fused": EmbeddingCache(64 << 20)}
    table = torch.randn(VOCAB, shape.lm_hidden, generator=torch.Generator().manual_seed(7))
    encoded: set = set()
    ok, step = True, 1
    while any(r.prefilled < r.length for r in requests):
        ok &= run_step(step, requests, names, encoder, caches, table, encoded)
        step += 1

    stats = caches["packed"].stats()
    print(
        f"\ncache (packed engine): {stats.entries} entries, {stats.bytes / 2**20:.1f} MiB, "
        f"{stats.hits} hits, {stats.misses} misses, {stats.evictions} evictions"
    )
    print(f"finished in {time.perf_counter() - started:.1f} s")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
