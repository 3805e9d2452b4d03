"""The explicit API: one prefill step from requests to rows.

A step runs these phases, each a function of its own, in this order:

1. ``plan_step``: which rows each request needs, every cache lookup (one lock);
2. ``agree_across_ranks`` (with a process group only): every rank's plan made the
   same, and phases 3-5 run through ``mm_schedule.ranks``;
3. ``check_sources``: the step's hits and precomputed embeddings fit it;
4. ``encode_misses``: one encoder call per encoder batch;
5. ``check_outputs``: every encoder output validated against the step and against what
   the cache holds for its modality (nothing cached yet);
6. ``insert_encoded``: validated outputs cached, under one lock;
7. assembly: the segment table copied by the trusted kernel path, then the cache
   hits acknowledged (once per successful step).

This module is the only one that changes the cache. The planner gets a read-only
lookup; validation names unfit entries in ``Expected.evict`` and a failed assembly
leaves the step's hits suspect: the step evicts them (``_Evictions``), whatever raised.

Two assembly modes:

* ``embed_chunk`` returns a packed ``[n_rows, H]`` tensor (SGLang's contract), rows in
  request order, then placeholder-position order;
* ``merge_chunk`` writes the rows straight into ``input_embeds`` at the placeholder
  rows (no intermediate buffer, no mask, no host sync).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_not
from typing import Any

import torch

from .assemble import (
    concat_rows,
    copy_rows,
    copy_whole_sources,
    fused_table,
    one_dtype,
    packed_table,
)
from .cache import EmbeddingCache
from .context import StepContext
from .encode import Encoders, encode_misses, written_memory
from .errors import (
    CachedEmbeddingError,
    CacheLayoutError,
    EncoderOutputError,
    InvalidItemError,
    KernelInputError,
)
from .items import as_index
from .kernels.backend import launches_kernels
from .kernels.segment_copy.contract import first_overlap
from .plan import (
    HIT,
    MISS,
    PRECOMPUTED,
    RequestChunk,
    StepPlan,
    as_requests,
    plan_columns,
    request_columns,
)
from .plan.columns import counting
from .spare import packed_buffer
from .validate import Expected, check_outputs, check_sources

DEFAULT_CONTEXT = StepContext()
# Sources a packed step concatenates with torch.cat (ATen's CUDA cat copies up to 128 inputs
# a launch, and on meta or a GPU it then costs the host less than packing a table); more are
# copied by their addresses in one launch of the segment kernel, whatever their number.
ONE_CAT_LAUNCH = 128


@dataclass(frozen=True)
class StepReport:
    """What a step did. ``cache_hits`` counts distinct cached embeddings used;
    ``hit_uses`` counts request items served from the cache (an image shared by three
    requests is one hit and three uses). ``items_encoded`` counts items passed to
    encoders (shared images once)."""

    encoder_calls: int
    items_encoded: int
    cache_hits: int
    hit_uses: int
    precomputed: int
    rows: int
    segments: int


class StepResult:
    """A step's outcome: its ``plan``, its ``report`` and ``embedding``: the packed rows
    (``embed_chunk``) or the updated ``input_embeds`` (``merge_chunk``); None when the
    step needs no multimodal row."""

    __slots__ = ("embedding", "plan")

    def __init__(self, plan: StepPlan, embedding: Any) -> None:
        self.plan = plan
        self.embedding = embedding

    @property
    def report(self) -> StepReport:
        plan = self.plan
        items = sum(len(plan.items_of(batch[0])) if batch[0] in plan.multi_items else len(batch)
                    for _, batch in plan.encoder_batches)
        return StepReport(
            encoder_calls=len(plan.encoder_batches), items_encoded=items, cache_hits=plan.kinds.count(HIT),
            hit_uses=len(plan.hit_items), precomputed=plan.kinds.count(PRECOMPUTED),
            rows=plan.n_rows, segments=len(plan.seg_source),
        )


def insert_encoded(cache: EmbeddingCache | None, plan: StepPlan, tensors: Sequence[Any],
                   encoded: Sequence[int], expected: Expected, *, checked: bool = False) -> None:
    """Cache the validated encoder outputs, keeping this step's own hits from eviction.
    The cache checks them against its layout per modality under its lock, so two steps
    racing to fill an empty cache cannot leave it holding both of two hidden sizes. A
    step whose hidden size ``input_embeds`` proves replaces a learned layout of another.
    ``checked``: ``check_outputs`` validated every one of them against ``expected`` (so
    with one dtype in the step, the cache need not read each tensor's layout again)."""
    if cache is None or not encoded:
        return
    keys, modalities = plan.keys, plan.modalities
    protect = plan.hit_keys if plan.has_hits else ()
    every = len(encoded) == len(keys) and encoded == counting(len(keys))  # a cold step, in order
    vouched = None
    if checked and len(expected.dtypes) == 1 and expected.hidden is not None and expected.device is not None:
        vouched = (expected.hidden, next(iter(expected.dtypes)), expected.device)
    try:
        if vouched is not None and expected.owned_storages is not None:
            # Nothing to read again: each output was checked alone in its storage.
            listed = (lambda column: column) if every else (lambda column: [column[s] for s in encoded])
            cache.insert_outputs(listed(keys), listed(tensors), listed(plan.rows), listed(modalities), vouched,
                                 expected.owned_storages, protect=protect, replace_learned=expected.proven)
            return
        if every:
            pairs, encoded_modalities = zip(keys, tensors), modalities
        else:
            pairs, encoded_modalities = ((keys[s], tensors[s]) for s in encoded), [modalities[s] for s in encoded]
        rows = None if vouched is None else plan.rows if every else [plan.rows[s] for s in encoded]
        cache.insert_many(pairs, protect=protect, modalities=encoded_modalities,
                          replace_learned=expected.proven, vouched=vouched, rows=rows)
    except CacheLayoutError as exc:
        source = next((s for s in encoded if keys[s] == exc.key), None)
        if source is None:
            raise
        item = plan.first_items[source]
        raise CacheLayoutError(
            f"request {plan.requests[source]}, item hash {getattr(item, 'hash', None)}: {exc}",
            key=exc.key, modality=exc.modality, got=exc.got, expected=exc.expected,
        ) from None


def update_cache(cache: EmbeddingCache | None, *, evict: Sequence[int] = (),
                 insert: Sequence[tuple[int, Any]] = ()) -> None:
    """Cache changes decided outside a planned step (EVS videos, resolved one by one):
    entries found unfit evicted, validated values (tensors, ``EmbeddingResult``s, either
    wrapped in ``ForModality`` to be held to its modality's layout) set, as one insert."""
    if cache is None:
        return
    if evict:
        cache.discard_many(evict)
    if insert:
        with cache.one_insert():  # one step, one insert
            for key, value in insert:
                cache.set(key, value)


def learn_cache_layouts(plan: StepPlan, cache: EmbeddingCache | None, expected: Expected) -> None:
    """What the cache holds (or was declared to hold) for each modality the step encodes,
    into ``expected``: the layouts that bind it (declared, or learned and confirmed), the
    learned ones nothing confirmed yet (``EmbeddingCache.layout_confirmed``: they bind no
    output; the insert replaces them when the step's outputs disagree), and the step's
    hits no layout vouches for. In a step whose hidden size ``input_embeds`` proves, a
    learned layout of another size binds nothing (the step's inserts replace it)."""
    if cache is None or MISS not in plan.kinds:
        return
    known, weak, sources, disputes = cache.step_layouts(set(plan.modalities),
                                                        expected.hidden if expected.proven else None)
    unvouched, weak_hits = [], {}
    if plan.has_hits:
        for key, kind, modality in zip(plan.keys, plan.kinds, plan.modalities):
            if kind is HIT and modality in weak:
                weak_hits.setdefault(modality, []).append(key)
            elif kind is HIT and modality not in known:
                unvouched.append(key)
    expected.learn_cache_layouts(known, unvouched, sources, weak=weak, weak_hits=weak_hits, disputes=disputes)


def agree_across_ranks(plan: StepPlan, expected: Expected, context: StepContext) -> tuple[StepPlan, Any]:
    """Phase 2: with a process group in ``context``, the plan every rank of it agrees on
    and the rank step that runs phases 3-5 for it (``mm_schedule.ranks``); otherwise
    ``(plan, None)``."""
    if context.group is None:
        return plan, None
    from .ranks.step import rank_step  # loads torch.distributed: only for steps with a group

    ranks = rank_step(context)
    return (plan, None) if ranks is None else (ranks.agree(plan, expected), ranks)


def prepare_rows(plan: StepPlan, encoders: Encoders, cache: EmbeddingCache | None, expected: Expected, *,
                 move_features: bool = False, ranks: Any = None) -> Sequence[Any]:
    """Phases 3-6 for a planned step: every source tensor, checked, misses encoded and
    cached, indexed by source."""
    tensors, encoded = checked_rows(plan, encoders, cache, expected, move_features=move_features, ranks=ranks)
    try:
        insert_encoded(cache, plan, tensors, encoded, expected, checked=ranks is None)
    except BaseException:
        # Refused (another layout), so insert_many never looked for entries these outputs
        # overwrote in a reused buffer: they go now.
        if cache is not None and encoded:
            cache.discard_storages(written_memory([tensors[s] for s in encoded]))
        raise
    return tensors


def checked_rows(plan: StepPlan, encoders: Encoders, cache: EmbeddingCache | None, expected: Expected, *,
                 move_features: bool = False, ranks: Any = None) -> tuple[Sequence[Any], Sequence[int]]:
    """Phases 3-5: every source tensor indexed by source (hits checked, misses encoded and
    checked against the step and what ``cache`` holds or was declared), and the sources
    encoded, which the caller caches (``insert_encoded``, or a step of several plans at once)."""
    if ranks is not None:
        learn_cache_layouts(plan, cache, expected)
        return ranks.prepare_rows(plan, encoders, expected, move_features=move_features)
    tensors = check_sources(plan, expected)
    if not plan.encoder_batches:
        return tensors, ()
    tensors = list(tensors)
    learn_cache_layouts(plan, cache, expected)
    written: set = set()  # memory the encoder calls wrote into, as returned (several calls only)
    outputs: list = []
    try:
        outputs = encode_misses(plan, encoders, device=expected.device, move_features=move_features,
                                written=written)
        encoded = check_outputs(plan, outputs, tensors, expected, written)
    except BaseException:
        # An encoder reusing its buffer may have written over cached entries (also in a
        # call before one that raised); the step stops before insert_many would notice,
        # so they go here.
        if cache is not None:
            cache.discard_storages(written | written_memory(*(output for _, output in outputs)))
        raise
    if written and cache is not None:
        cache.discard_storages(written)  # copies of the outputs are cached, not that memory
    return tensors, encoded


class _Evictions:
    """Around a step's phases 2-7: evicts what validation named unfit, and the step's
    hits when assembly failed (a bad entry is never served again)."""

    __slots__ = ("assembling", "cache", "expected", "plan")

    def __init__(self, cache: EmbeddingCache | None, expected: Expected) -> None:
        self.cache, self.expected, self.plan, self.assembling = cache, expected, None, False

    def __enter__(self) -> _Evictions:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        cache = self.cache
        if cache is None:
            return
        dispute = self.expected.dispute
        if dispute is not None:
            cache.note_dispute(*dispute)
        evict = self.expected.evict
        if kind is not None and self.assembling and self.plan is not None and self.plan.has_hits:
            evict = evict + self.plan.hit_keys
        if evict:
            cache.discard_many(evict)


def acknowledge_hits(plan: StepPlan, context: StepContext) -> None:
    if context.on_cache_hit is not None and plan.has_hits:
        context.on_cache_hit(plan.hit_items, context.parallel)


def run_packed(plan: StepPlan, encoders: Encoders, cache: EmbeddingCache | None, context: StepContext, *,
               device: Any = None, out: Any = None, dtype: Any = None, move_features: bool = False) -> StepResult:
    """Phases 3-7 in packed mode for an already planned step."""
    hidden = None
    if out is not None:
        device = out.device if device is None else device
        hidden = out.shape[-1] if out.dim() == 2 else None
    expected = Expected(hidden, None if device is None else _concrete(device), "out")
    with _Evictions(cache, expected) as step:
        plan, ranks = agree_across_ranks(plan, expected, context)
        tensors = prepare_rows(plan, encoders, cache, expected, move_features=move_features, ranks=ranks)
        step.plan, step.assembling = plan, True
        embedding = assemble_packed(plan, tensors, expected, out=out, dtype=dtype)
    acknowledge_hits(plan, context)
    return StepResult(plan, embedding)


def assemble_packed(plan: StepPlan, tensors: Sequence[Any], expected: Expected, *, out: Any = None,
                    dtype: Any = None) -> Any:
    """Phase 7 in packed mode: the plan's rows from its checked source ``tensors``, into ``out``
    or new memory of ``dtype`` (default: the sources' dtype, promoted if they differ); None
    when the plan needs no row. Never a view of a source: the rows are copies."""
    if not plan.n_rows:
        return None
    target = out.dtype if out is not None else dtype
    dtypes = expected.dtypes
    if target is None:
        target = next(iter(dtypes)) if len(dtypes) == 1 else _promoted(dtypes)
    table = packed_table(plan)
    if out is None and table.whole_sources_rows is not None and dtypes == {target}:
        device = expected.device
        addresses = plan.addresses if tensors is plan.tensors else expected.source_addresses
        if addresses is not None and len(addresses) > ONE_CAT_LAUNCH and launches_kernels(device):
            # Every source a cache hit where the cache keeps it, or every one just encoded and
            # checked: one launch from their addresses, no tensor read again on the host.
            out = torch.empty((plan.n_rows, expected.hidden), dtype=target, device=device)
            return copy_whole_sources(addresses, plan.rows, out, target)
        # Every source whole, in order, one dtype: their concatenation (one torch.cat, one
        # launch for up to ONE_CAT_LAUNCH on a GPU, into memory allocated first as above; on
        # the CPU into reused memory for a large result, with streaming stores).
        out = packed_buffer(plan.n_rows, expected.hidden, target, device) if device.type == "cpu" else \
            torch.empty((plan.n_rows, expected.hidden), dtype=target, device=device)
        return concat_rows(plan, tensors, out)
    if out is None:
        out = packed_buffer(plan.n_rows, expected.hidden, target, expected.device)
        if out is None:
            out = torch.empty((plan.n_rows, expected.hidden), dtype=target, device=expected.device)
    else:
        _check_out(out, plan.n_rows, expected)
    if len(dtypes) > 1:
        tensors = one_dtype(tensors, target)
    return copy_rows(tensors, table, out)


def _concrete(device: Any) -> Any:
    """``device`` as tensors report theirs: ``"cuda"`` names the current GPU, ``cuda:0``."""
    if type(device) is torch.device and (device.index is not None or device.type in ("cpu", "meta")):
        return device
    device = torch.device(device)
    if device.index is None and device.type not in ("cpu", "meta"):
        device = torch.empty(0, device=device).device
    return device


def _promoted(dtypes: set) -> Any:
    result = None
    for d in dtypes:
        result = d if result is None else torch.promote_types(result, d)
    return result


def _check_out(out: Any, rows: int, expected: Expected) -> None:
    if out.dim() != 2 or out.shape[0] < rows or out.shape[1] != expected.hidden:
        raise KernelInputError(
            f"out has shape {tuple(out.shape)}; the step needs at least [{rows}, {expected.hidden}]"
        )
    if not out.is_contiguous():
        raise KernelInputError("out must be contiguous")


def embed_chunk(
    requests: Iterable[RequestChunk],
    encoders: Encoders,
    *,
    cache: EmbeddingCache | None = None,
    context: StepContext = DEFAULT_CONTEXT,
    device: Any = None,
    out: Any = None,
    dtype: Any = None,
) -> StepResult:
    """Packed mode: ``result.embedding`` is ``[n_rows, H]`` (None when the step needs no rows).

    ``device``: where the rows are assembled (encoder outputs must already be there;
    cached entries kept elsewhere are moved); default: where the step's sources are.
    ``out``: a contiguous buffer of at least ``n_rows`` rows to write into.
    ``dtype``: of the new buffer (default: the sources' dtype, promoted if they differ).
    """
    columns = request_columns(as_requests(requests))
    return run_packed_planned(
        lambda: plan_columns(*columns, cache, context.max_tokens_per_encoder_call),
        encoders, cache, context, device=device, out=out, dtype=dtype,
    )


def run_packed_planned(make_plan: Callable[[], StepPlan], encoders: Encoders, cache: EmbeddingCache | None,
                       context: StepContext, **packed: Any) -> StepResult:
    """``run_packed`` of ``make_plan()``; planned once more when the step's cached hits of a
    layout nothing vouches for (declared or confirmed) disagreed with its encoder outputs:
    they were evicted with the error, so the second plan encodes them with the rest. With a
    process group every rank must take the same path, so the error stands there (the
    ranks settle it)."""
    try:
        return run_packed(make_plan(), encoders, cache, context, **packed)
    except EncoderOutputError as exc:
        if not getattr(exc, "hits_evicted", False) or context.group is not None or cache is None:
            raise
    return run_packed(make_plan(), encoders, cache, context, **packed)


def embeddings_2d(input_embeds: Any) -> Any:
    """``input_embeds`` as ``[tokens, H]`` sharing its storage: ``[T, H]`` as is, ``[B, L, H]``
    (e.g. a ``[1, L, H]`` batch of one) flattened over its leading dims."""
    if input_embeds.dim() < 2:
        raise KernelInputError(
            f"input_embeds must be [tokens, hidden] (or [batch, length, hidden]), got shape {tuple(input_embeds.shape)}"
        )
    if not input_embeds.is_contiguous():
        raise KernelInputError(
            "input_embeds must be contiguous to be written in place; pass input_embeds.contiguous() and use the result"
        )
    return input_embeds if input_embeds.dim() == 2 else input_embeds.view(-1, input_embeds.shape[-1])


def check_fused_rows(extends: Sequence[int], row_offsets: Sequence[int | None], total_rows: int) -> None:
    """The requests must account for every row of ``input_embeds``: a request left out of
    the list would otherwise have its text rows overwritten by the next request's rows."""
    if set(map(type, extends)) - {int}:  # anything but plain ints: checked and converted one by one
        extends = [as_index(e, request=i, what="extend") for i, e in enumerate(extends)]
    if not any(map(is_not, row_offsets, repeat(None))):
        needed = sum(extends) if min(extends, default=0) >= 0 else sum(e for e in extends if e > 0)
        if needed != total_rows:
            raise InvalidItemError(
                f"input_embeds has {total_rows} rows but the requests' extend lengths add up to {needed};"
                " pass every request of the forward batch (text-only ones too, with no items),"
                " or give each RequestChunk its row_offset"
            )
        return
    ranges, base = [], 0
    for index, (extend, row) in enumerate(zip(extends, row_offsets)):
        # A request without its own row offset starts after every earlier request's
        # extend tokens, as the planner places it.
        start = base if row is None else as_index(row, request=index, what="row_offset")
        base += max(extend, 0)
        if extend > 0:
            if start < 0 or start + extend > total_rows:
                raise InvalidItemError(
                    f"request {index}: rows [{start}, {start + extend}) lie outside input_embeds' {total_rows} rows"
                )
            ranges.append((start, start + extend, index))
    overlap = first_overlap(ranges)
    if overlap is not None:
        raise InvalidItemError(f"requests {overlap[0]} and {overlap[1]} claim the same rows of input_embeds")


def merge_chunk(
    input_embeds: Any,
    requests: Iterable[RequestChunk],
    encoders: Encoders,
    *,
    cache: EmbeddingCache | None = None,
    context: StepContext = DEFAULT_CONTEXT,
) -> StepResult:
    """Fused mode: write every needed row into ``input_embeds`` (in place) at the
    placeholder's token row (``RequestChunk.row_offset`` + position - prefix).

    ``input_embeds`` is ``[tokens, H]`` or ``[B, L, H]`` (flattened: row = b * L + l),
    contiguous. ``result.embedding`` is ``input_embeds`` when rows were written, else None.
    """
    columns = request_columns(as_requests(requests))
    flat = embeddings_2d(input_embeds)
    check_fused_rows(columns[2], columns[4], flat.shape[0])
    plan = plan_columns(*columns, cache, context.max_tokens_per_encoder_call)
    try:
        return run_fused(plan, input_embeds, encoders, cache, context)
    except CachedEmbeddingError as exc:
        # A hit that input_embeds proves unfit (an entry of an earlier model or a faulty
        # encoder call) was evicted before anything was encoded: plan once more, so the
        # step encodes it instead of failing. With a process group every rank must take
        # the same path, so the error stands (the ranks settle it).
        if not getattr(exc, "before_encoding", False) or context.group is not None or cache is None:
            raise
    plan = plan_columns(*columns, cache, context.max_tokens_per_encoder_call)
    return run_fused(plan, input_embeds, encoders, cache, context)


def run_fused(plan: StepPlan, input_embeds: Any, encoders: Encoders, cache: EmbeddingCache | None,
              context: StepContext, *, move_features: bool = False) -> StepResult:
    """Phases 3-7 in fused mode for an already planned step (its rows already checked
    against ``input_embeds`` by ``check_fused_rows``)."""
    flat = embeddings_2d(input_embeds)
    expected = Expected(flat.shape[1], flat.device)
    with _Evictions(cache, expected) as step:
        plan, ranks = agree_across_ranks(plan, expected, context)
        tensors = prepare_rows(plan, encoders, cache, expected, move_features=move_features, ranks=ranks)
        step.plan, step.assembling = plan, True
        written = None
        if plan.n_rows:
            if len(expected.dtypes) > 1:
                tensors = one_dtype(tensors, flat.dtype)
            copy_rows(tensors, fused_table(plan), flat)
            written = input_embeds
    acknowledge_hits(plan, context)
    return StepResult(plan, written)
