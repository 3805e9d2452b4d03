"""A minimal chunked-prefill loop around a transformers VLM, for the demo.

Each step prefills up to ``chunk`` tokens of every active request. The multimodal
rows of the whole step come from one ``merge_chunk`` call (all requests' cache misses
encoded together); the decoder then runs each request's chunk on top of its own KV
cache. ``per_request_step`` is the path we compare against: the same API called once
per request, so each request that misses gets its own encoder call (what SGLang's
by-item path, which it keeps on ROCm, NPU and XPU, does).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mm_schedule import EmbeddingCache, RequestChunk, merge_chunk
from mm_schedule.integrations.transformers import VisionAdapter


@dataclass
class Request:
    name: str
    inputs: dict[str, torch.Tensor]  # the processor's output for this prompt
    arrives: int = 1  # the step at which it joins
    items: list = field(default_factory=list)
    prefilled: int = 0
    embeds: list = field(default_factory=list)  # this request's assembled rows, chunk by chunk
    kv: Any = None
    last_logits: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.inputs["input_ids"].shape[1]


def schedule(requests: list[Request], step: int, chunk: int) -> list[tuple[Request, int, int]]:
    """``(request, prefix, extend)`` of every request that prefills in ``step``."""
    return [(r, r.prefilled, min(chunk, r.length - r.prefilled)) for r in requests if r.arrives <= step and r.prefilled < r.length]


def batched_step(adapter: VisionAdapter, cache: EmbeddingCache, plan: list[tuple[Request, int, int]], encoder=None):
    """All requests' multimodal rows of one step through one ``merge_chunk`` call (the
    encoder is ``adapter`` unless another is given). Returns the step's
    ``input_embeds`` split per request, the report and the host time."""
    started = time.perf_counter()
    ids = torch.cat([r.inputs["input_ids"][0, p : p + e] for r, p, e in plan])
    embeds = adapter.embed_text(ids)
    chunks = [RequestChunk(r.items, p, e) for r, p, e in plan]
    result = merge_chunk(embeds, chunks, encoder or adapter, cache=cache)
    elapsed = time.perf_counter() - started
    return list(embeds.split([e for _, _, e in plan])), result.report, elapsed


def per_request_step(adapter: VisionAdapter, cache: EmbeddingCache, plan: list[tuple[Request, int, int]]):
    """The same step, one ``merge_chunk`` call per request. Returns the per-request
    embeddings, the number of encoder calls and the host time."""
    started = time.perf_counter()
    pieces, calls = [], 0
    for r, p, e in plan:
        embeds = adapter.embed_text(r.inputs["input_ids"][0, p : p + e])
        calls += merge_chunk(embeds, [RequestChunk(r.items, p, e)], adapter, cache=cache).report.encoder_calls
        pieces.append(embeds)
    return pieces, calls, time.perf_counter() - started


class RecordingEncoder:
    """An encoder that keeps a copy of every item's rows it returns, by item hash: what
    the scheduler had to assemble, for checking that assembly copied them exactly."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        self.rows: dict[int, torch.Tensor] = {}

    def __call__(self, items: list) -> list[torch.Tensor]:
        out = self.encoder(items)
        for item, rows in zip(items, out):
            self.rows[item.hash] = rows.clone()
        return out

    def request_rows(self, items: list) -> dict[str, torch.Tensor]:
        """One request's recorded rows per modality, in prompt order."""
        per_modality: dict[str, list[torch.Tensor]] = {}
        for item in sorted(items, key=lambda it: it.offsets[0][0]):
            per_modality.setdefault(str(item.modality), []).append(self.rows[item.hash])
        return {modality: torch.cat(rows) for modality, rows in per_modality.items()}


def decode_chunk(model: Any, request: Request, embeds: torch.Tensor, prefix: int, positions: torch.Tensor | None) -> None:
    """Run the decoder on one chunk of ``request`` over its KV cache (prefill only)."""
    from transformers import DynamicCache

    if request.kv is None:
        request.kv = DynamicCache()
    n = embeds.shape[0]
    kwargs = {"cache_position": torch.arange(prefix, prefix + n)}
    if positions is not None:
        kwargs["position_ids"] = positions[..., prefix : prefix + n]
    # transformers 5.x renamed the forward's past_key_values to cache (the old name warns).
    kwargs["cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"] = request.kv
    with torch.no_grad():
        out = model(inputs_embeds=embeds[None], use_cache=True, **kwargs)
    request.last_logits = out.logits[0, -1]
