"""The explicit API: plan a step, encode its misses in as few calls as possible,
cache them, and assemble the rows with one kernel launch.

Two assembly modes:
* ``embed_chunk`` returns a packed ``[n_rows, H]`` tensor (SGLang's contract), rows in
  request order, then placeholder-position order;
* ``merge_chunk`` writes the rows straight into ``input_embeds`` at the placeholder
  rows (no intermediate buffer, no mask, no host sync).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from .cache import EmbeddingCache
from .context import StepContext
from .encode import encode_misses
from .errors import EmbeddingLengthMismatch
from .plan import HIT, PRECOMPUTED, RequestChunk, StepPlan, plan_step


def rank_step(context: StepContext):
    # Imported on use: a single-rank step never loads torch.distributed.
    from .ranks.step import rank_step

    return rank_step(context)

Encoders = Callable | Mapping[Any, Callable]
DEFAULT_CONTEXT = StepContext()


@dataclass(frozen=True)
class StepReport:
    encoder_calls: int
    items_encoded: int
    cache_hits: int
    precomputed: int
    rows: int
    segments: int


@dataclass
class StepResult:
    plan: StepPlan
    report: StepReport
    embedding: Any = None  # packed rows (embed_chunk) or the updated input_embeds (merge_chunk)


def _prepare_sources(plan: StepPlan, device: Any) -> list[Any]:
    tensors = []
    for s in plan.sources:
        t = s.tensor
        if s.status == PRECOMPUTED:
            t = t.reshape(-1, t.shape[-1])
            if t.shape[0] != s.rows:
                raise EmbeddingLengthMismatch(
                    expected=s.rows, received=t.shape[0], request=s.request,
                    item_hash=getattr(s.items[0], "hash", None), what="precomputed embedding rows",
                )
        else:
            t = t.reshape(-1, t.shape[-1])
        if device is not None and t.device != device:
            t = t.to(device, non_blocking=True)
        tensors.append(t.contiguous())
    return tensors


def _common_dtype(tensors: list[Any], dtype: Any) -> list[Any]:
    """The kernels read one source dtype per launch (and cast it on the fly); sources
    that disagree (say, a bf16 image encoder beside an fp32 audio one in a fused
    merge) are converted up front."""
    if len({t.dtype for t in tensors}) <= 1:
        return tensors
    target = dtype or tensors[0].dtype
    return [t.to(target) for t in tensors]


def run_step(
    requests: Sequence[RequestChunk],
    encoders: Encoders,
    *,
    cache: EmbeddingCache | None,
    context: StepContext,
    device: Any = None,
    assemble: Callable[[StepPlan, list[Any]], Any],
) -> StepResult:
    plan = plan_step(requests, cache, max_tokens_per_encoder_call=context.max_tokens_per_encoder_call)
    ranks = rank_step(context) if context.group is not None else None
    if ranks is not None:
        ranks.agree(plan)
    if plan.hit_items and context.on_cache_hit is not None:
        context.on_cache_hit(plan.hit_items, context.parallel)
    # This step's hits stay cached while its misses are inserted; assembly itself reads
    # the tensors the plan holds, so no later eviction can take rows away from it.
    with cache.pin(plan.hit_keys) if cache is not None else nullcontext():

        def encode(batches=None):
            return encode_misses(
                plan, encoders, device=device, move_features=context.move_features, batches=batches
            )

        calls, encoded = encode() if ranks is None else ranks.encode(plan, encode, device)
        if cache is not None:
            for s in plan.sources:
                if s.status not in (HIT, PRECOMPUTED) and s.tensor is not None:
                    cache.insert(s.key, s.tensor)
    tensors = _prepare_sources(plan, device)
    output = assemble(plan, tensors) if plan.segments else None
    report = StepReport(
        encoder_calls=calls,
        items_encoded=encoded,
        cache_hits=sum(s.status == HIT for s in plan.sources),
        precomputed=sum(s.status == PRECOMPUTED for s in plan.sources),
        rows=plan.n_rows,
        segments=len(plan.segments),
    )
    return StepResult(plan=plan, report=report, embedding=output)


def embed_chunk(
    requests: Sequence[RequestChunk],
    encoders: Encoders,
    *,
    cache: EmbeddingCache | None = None,
    context: StepContext = DEFAULT_CONTEXT,
    device: Any = None,
    out: Any = None,
    dtype: Any = None,
) -> StepResult:
    """Packed mode: ``result.embedding`` is ``[n_rows, H]`` (None when the step needs no rows)."""
    from .kernels import gather_segments

    def assemble(plan: StepPlan, tensors: list[Any]) -> Any:
        segments = [(g.source, g.src_row, g.n_rows, g.packed_row) for g in plan.segments]
        target = dtype if out is None else out.dtype
        return gather_segments(_common_dtype(tensors, target), segments, out=out, dtype=dtype)

    return run_step(requests, encoders, cache=cache, context=context, device=device, assemble=assemble)


def merge_chunk(
    input_embeds: Any,
    requests: Sequence[RequestChunk],
    encoders: Encoders,
    *,
    cache: EmbeddingCache | None = None,
    context: StepContext = DEFAULT_CONTEXT,
) -> StepResult:
    """Fused mode: write every needed row into ``input_embeds`` (in place) at the
    placeholder's token row (``RequestChunk.row_offset`` + position - prefix)."""
    from .kernels import merge_segments

    def assemble(plan: StepPlan, tensors: list[Any]) -> Any:
        segments = [(g.source, g.src_row, g.n_rows, g.token_row) for g in plan.segments]
        return merge_segments(_common_dtype(tensors, input_embeds.dtype), segments, input_embeds)

    result = run_step(
        requests, encoders, cache=cache, context=context, device=input_embeds.device, assemble=assemble
    )
    result.embedding = input_embeds
    return result
