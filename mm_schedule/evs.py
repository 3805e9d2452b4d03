"""Efficient video sampling (EVS): video rows pruned by the encoder, placeholders moved to match.

An EVS video encoder drops tokens that barely change from one frame to the next and reports
how many each frame kept (``EVSEmbeddingResult.num_tokens_per_frame``). The processor
already reserved the right *total* number of placeholders (it knows the pruning rate) but
had to spread them evenly over the frames; once the encoder has run, every frame's run of
placeholders is resized to what that frame kept. The prompt keeps its length, but inside
the video the placeholders move, so a chunk's rows *and its input_ids* depend on the
encoder's output. This is SGLang 0.5.19's behaviour for ``get_embedding_and_mask``:

* a video item takes part when its ``model_specific_data`` holds ``"pre_chunked_input_ids"``,
  the whole prompt as the processor produced it; it must be the only item of its modality
  in its request (the frame counts describe one video), and the call is for videos only
  (SGLang calls once per modality);
* the rewritten prompt is that prompt with span k replaced by ``num_tokens_per_frame[k]``
  copies of the item's ``pad_value`` (an item with a single span gets their sum);
  everything else is copied;
* the request's tokens in ``input_ids`` become ``rewritten[prefix : prefix + extend]``, and
  its rows are the pruned embedding's rows for the ``pad_value`` positions in that window;
* the pruned result (rows and frame counts) is cached under the request's combined key
  (``combine_hashes`` of its item hashes) and a cache hit is redistributed the same way; a
  plain tensor from the encoder means nothing was pruned and nothing is rewritten.

Beyond SGLang, what the cache holds is guarded as for planned items: a video's rows must
have the layout the cache holds or was declared to hold for its modality, and are cached
with that modality (``ForModality``), so they are held to it under the cache's lock too.
Each video's rows are copied before the encoder runs again (an encoder may reuse its output
buffer), a hit that this call's encode overwrote is evicted (``CachedEmbeddingError``), and
the rows returned are the caller's own memory, never a view of a cache entry.

And beyond SGLang, which handles only a batch made of that one request: any number of
requests (EVS or not) share a batch, provided ``input_ids`` is exactly the listed
requests' extend tokens; a window that misses the video neither encodes nor rewrites
anything (the rewrite leaves the prompt outside the video as it was); every inconsistency
is a typed error naming the request and item hash, never a crop or a host-side assert.
With a process group the videos meet the ranks as planned items do (``ranks/videos.py``):
hits and misses agreed, faults raised on every rank, the encoding shared out on request.
Where ``input_ids`` cannot be rewritten (``embed_chunk``/``merge_chunk``, or a video
without its prompt ids) an EVS result is refused (``EncoderOutputError``): its rows
placed at the processor's positions would be silently wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .cache import EmbeddingCache, EmbeddingResult, ForModality, storage_id
from .context import StepContext
from .encode import Encoder, as_encoder, move_features_to, written_memory
from .errors import (
    CachedEmbeddingError,
    CacheLayoutError,
    EmbeddingLengthMismatch,
    EncoderOutputError,
    InvalidItemError,
)
from .items import Span, check_spans, item_spans, modality_name, span_tokens
from .keys import combine_hashes, item_key
from .placeholders import checked_mask, count_mm_tokens_in_extend
from .plan import StepPlan, plan_columns
from .scheduler import (
    acknowledge_hits,
    agree_across_ranks,
    assemble_packed,
    checked_rows,
    insert_encoded,
    update_cache,
)
from .validate import Expected, check_tensor

PRE_CHUNKED_KEY = "pre_chunked_input_ids"


@dataclass(kw_only=True)
class EVSEmbeddingResult(EmbeddingResult):
    """A pruned video embedding and the tokens each frame kept (they sum to its rows)."""

    num_tokens_per_frame: Sequence[int]


def _frame_counts(counts: Any, request: int, item_hash: Any) -> list[int]:
    """``num_tokens_per_frame`` as ints: a sequence (or 1-D integer tensor) of integers;
    a string (``"51"`` would read as ``[5, 1]``), floats or bools are refused."""
    if hasattr(counts, "tolist"):  # a tensor or array: its elements, checked below like any list's
        counts = counts.tolist()
    if isinstance(counts, (str, bytes)) or not isinstance(counts, (list, tuple)) \
            or not all(type(n) is int or (hasattr(n, "__index__") and not isinstance(n, bool)) for n in counts):
        raise EncoderOutputError(
            f"request {request}, item hash {item_hash}: num_tokens_per_frame must be a sequence of integers,"
            f" got {type(counts).__name__} {counts!r}"[:300]
        )
    return [n.__index__() for n in counts]


# Frame counts a request's earlier chunks were placed with, kept on the item (which lives
# as long as its request): a re-encode after an eviction must prune the same way.
_PLACED_WITH = "_mm_schedule_evs_frame_tokens"


def is_pruned_video(item: Any) -> bool:
    data = getattr(item, "model_specific_data", None)
    return bool(data) and PRE_CHUNKED_KEY in data


def pruned_video_requests(items: Sequence[Any], items_size: Sequence[int], n_requests: int) -> list[int]:
    """Requests (SGLang layout) whose first item is an EVS video; SGLang reads the frame
    counts against its request's first item too. SGLang calls once per modality, so a
    call whose first item is not a video has none, and image calls skip the scan."""
    if not items or modality_name(getattr(items[0], "modality", "IMAGE")) != "VIDEO":
        return []
    return [
        i for i in range(n_requests)
        if items_size[i] < items_size[i + 1] and is_pruned_video(items[items_size[i]])
    ]


def redistribute(prompt: Sequence[int], spans: Sequence[Span], frame_tokens: Sequence[int], filler: int) -> list[int]:
    """``prompt`` with each span's placeholder run resized to its frame's kept tokens
    (one span takes them all), filled with ``filler``."""
    counts = [sum(frame_tokens)] if len(spans) == 1 else frame_tokens
    out: list[int] = []
    cursor = 0
    for (start, end), n in zip(spans, counts):
        out += prompt[cursor:start]
        out += [filler] * n
        cursor = end + 1
    out += prompt[cursor:]
    return out


# -- one request --------------------------------------------------------------------------


@dataclass
class _Chunk:
    rows: Any = None  # [n, H] rows of this request's window, or None
    window: list[int] | None = None  # rewritten input_ids of the window, or None (unchanged)


class _PrunedVideo:
    """One request whose single item is an EVS video: checks, cache, encoder, rewrite."""

    def __init__(self, index: int, items: Sequence[Any], prefix: int, extend: int, offsets: Any) -> None:
        if len(items) != 1:
            raise InvalidItemError(
                f"request {index}: an EVS video must be the only item of its modality in its request"
                f" (its frame counts describe one video); got {len(items)} items"
            )
        self.index, self.item, self.prefix, self.extend = index, items[0], prefix, extend
        self.hash = getattr(self.item, "hash", None)
        self.modality = modality_name(getattr(self.item, "modality", "VIDEO"))
        self.spans = item_spans(self.item, request=index)
        check_spans(self.spans, request=index, what="EVS video")
        if offsets is not None and sorted((int(s), int(e)) for s, e in offsets) != self.spans:
            raise InvalidItemError(
                f"request {index}, item hash {self.hash}: request offsets {list(offsets)} differ from"
                f" the EVS video's offsets {self.spans}"
            )
        self.key = combine_hashes([item_key(self.hash, index)])  # SGLang's whole-request key
        self.placeholders = span_tokens(self.spans)

    def _fail(self, what: str) -> InvalidItemError:
        return InvalidItemError(f"request {self.index}, item hash {self.hash}: {what}")

    def needs_encoder(self) -> bool:
        """Only a window that meets the video depends on the encoder's frame counts."""
        window_end = self.prefix + self.extend  # exclusive
        return self.extend > 0 and self.spans[0][0] < window_end and self.spans[-1][1] >= self.prefix

    def prompt(self) -> list[int]:
        prompt = self.item.model_specific_data[PRE_CHUNKED_KEY]
        prompt = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
        if len(prompt) <= self.spans[-1][1]:
            raise self._fail(f"{PRE_CHUNKED_KEY} has {len(prompt)} tokens; the video ends at position {self.spans[-1][1]}")
        if self.prefix + self.extend > len(prompt):
            raise self._fail(
                f"window [{self.prefix}, {self.prefix + self.extend}) runs past the {len(prompt)} tokens of {PRE_CHUNKED_KEY}"
            )
        return prompt

    def frame_tokens(self, value: Any) -> list[int] | None:
        counts = getattr(value, "num_tokens_per_frame", None)
        if counts is None:
            if isinstance(value, EVSEmbeddingResult):
                raise EncoderOutputError(
                    f"request {self.index}, item hash {self.hash}: an EVS result with num_tokens_per_frame=None;"
                    " return a plain tensor when nothing was pruned"
                )
            return None
        counts = _frame_counts(counts, self.index, self.hash)
        if any(n < 0 for n in counts):
            raise EncoderOutputError(f"request {self.index}, item hash {self.hash}: negative frame token count in {counts}")
        if len(self.spans) > 1 and len(counts) != len(self.spans):
            raise EncoderOutputError(
                f"request {self.index}, item hash {self.hash}: {len(counts)} frame token counts"
                f" for a video with {len(self.spans)} frame spans"
            )
        if sum(counts) != self.placeholders:
            raise EmbeddingLengthMismatch(
                expected=self.placeholders, received=sum(counts), request=self.index, item_hash=self.hash,
                what="tokens kept by EVS (sum of num_tokens_per_frame) vs placeholders the processor reserved",
            )
        return counts

    def rows_of(self, value: Any, counts: list[int] | None, expected: Expected) -> Any:
        """The 2-D rows of an encoder output or cache value, validated like any encoder
        output: one floating tensor (or a one-item list) on the step's device, with the
        step's hidden size and one row per kept token."""
        if not hasattr(value, "shape") and hasattr(value, "embedding"):
            value = value.embedding
        if isinstance(value, (list, tuple)):
            if len(value) != 1:
                raise EmbeddingLengthMismatch(
                    expected=1, received=len(value), request=self.index, item_hash=self.hash,
                    what="encoder outputs (one tensor per item)",
                )
            value = value[0]
        where = f"request {self.index}, item hash {self.hash}"
        rows = check_tensor(value, expected, where, "the video embedding")
        self.check_layout(rows, expected)
        want = self.placeholders if counts is None else sum(counts)
        if rows.shape[0] != want:
            raise EmbeddingLengthMismatch(
                expected=want, received=rows.shape[0], request=self.index, item_hash=self.hash,
                what="video embedding rows" if counts is None else "pruned video rows (sum of num_tokens_per_frame)",
            )
        return rows

    def check_layout(self, rows: Any, expected: Expected) -> None:
        """The rows against the layout the cache holds (or was declared to hold) for the
        video's modality: they are cached under it, and later chunks are served from there."""
        known = expected.known.get(self.modality)
        if known is None:
            return
        hidden, dtype = known
        if (hidden is not None and rows.shape[-1] != hidden) or (dtype is not None and rows.dtype != dtype):
            source = expected.sources.get(self.modality, "")
            raise CacheLayoutError(
                f"request {self.index}, item hash {self.hash}: the video embedding has hidden size {rows.shape[-1]}"
                f" and dtype {rows.dtype}; {self.modality} embeddings must have hidden size {hidden} and dtype"
                f" {dtype}{f' ({source})' if source else ''}. Nothing of this step was cached",
                key=self.key, modality=self.modality, got=(rows.shape[-1], rows.dtype), expected=known,
            )

    def check_placement(self, counts: list[int] | None) -> None:
        """Earlier chunks of this request placed rows by the frame counts they saw; a
        re-encode (after the entry was evicted) that prunes otherwise would put this
        chunk's rows at other positions than the prompt already holds."""
        placed = getattr(self.item, _PLACED_WITH, None)
        now = None if counts is None else tuple(counts)
        if placed is not None and placed != now and self.prefix > 0:
            raise EncoderOutputError(
                f"request {self.index}, item hash {self.hash}: the encoder pruned the video into frame counts"
                f" {list(now) if now is not None else None}, but earlier chunks of this request were placed with"
                f" {list(placed)}; an EVS encoder must prune one video the same way every time"
            )

    def record_placement(self, counts: list[int] | None) -> None:
        """Remember the frame counts this chunk was placed with (once the step succeeded)."""
        try:
            setattr(self.item, _PLACED_WITH, None if counts is None else tuple(counts))
        except AttributeError:  # an item that takes no attribute: nothing to compare with later
            pass

    def check_ids(self, ids: Any) -> None:
        """The engine's tokens of this request's window must be the processor's prompt
        there (``pre_chunked_input_ids``), which the rewrite starts from."""
        window = self.prompt()[self.prefix : self.prefix + self.extend]
        got = ids.tolist()
        if got != window:
            at = next((k for k, (a, b) in enumerate(zip(got, window)) if a != b), min(len(got), len(window)))
            raise self._fail(
                f"input_ids differ from {PRE_CHUNKED_KEY} at position {self.prefix + at} of the window"
                f" [{self.prefix}, {self.prefix + self.extend}) ({len(got)} tokens given, {len(window)} expected)"
            )

    def chunk(self, rows: Any, counts: list[int] | None) -> _Chunk:
        window_end = self.prefix + self.extend
        if counts is None:  # nothing pruned: the original spans hold
            before = sum(max(0, min(e + 1, self.prefix) - s) for s, e in self.spans)
            inside = sum(max(0, min(e + 1, window_end) - max(s, self.prefix)) for s, e in self.spans)
            return _Chunk(rows=rows[before : before + inside])
        filler = getattr(self.item, "pad_value", None)
        if filler is None:
            raise self._fail("EVS video has no pad_value to fill its placeholders with")
        prompt = redistribute(self.prompt(), self.spans, counts, int(filler))
        placed = prompt.count(int(filler))
        if placed != rows.shape[0]:
            raise self._fail(
                f"after redistribution the prompt holds {placed} pad_value tokens for {rows.shape[0]} rows"
                f" ({PRE_CHUNKED_KEY} carries the pad_value outside the video's spans)"
            )
        window = prompt[self.prefix : window_end]
        before = prompt[: self.prefix].count(int(filler))
        return _Chunk(rows=rows[before : before + window.count(int(filler))], window=window)


@dataclass
class _Resolved:
    rows: Any
    counts: list[int] | None
    hit: bool


def _cached(video: _PrunedVideo, lookup: Callable | None, expected: Expected) -> _Resolved | None:
    """The video's valid cache entry (``lookup`` is read-only), or None. An unfit entry
    (another video under a colliding key, a stale one) is named in ``expected.evict``."""
    cached = lookup(video.key) if lookup is not None else None
    if cached is None:
        return None
    try:
        counts = video.frame_tokens(cached)
        return _Resolved(video.rows_of(cached, counts, expected), counts, True)
    except (EmbeddingLengthMismatch, EncoderOutputError):
        expected.evict.append(video.key)
        return None


def _encoded(video: _PrunedVideo, encoder: Encoder, expected: Expected, written: set) -> _Resolved:
    """The video encoded and validated (the step caches it once the whole step is valid).
    ``written`` gets the memory the output came in before anything is checked: an invalid
    output may still have overwritten an entry cached by reference."""
    if encoder.move_features and expected.device is not None:
        move_features_to([video.item], expected.device)
    output = encoder([video.item])
    written.update(written_memory(output))
    counts = video.frame_tokens(output)
    return _Resolved(video.rows_of(output, counts, expected), counts, False)


def _cache_value(video: _PrunedVideo, resolved: _Resolved) -> ForModality:
    """What the step caches for an encoded video: its rows as validated (the cache copies
    a view of a larger output, and notices an encoder reusing its buffer, only when it is
    given the tensor the encoder returned), with the modality whose layout they must have."""
    rows = resolved.rows.detach()
    if resolved.counts is None:
        return ForModality(EmbeddingResult(embedding=rows), video.modality)
    return ForModality(EVSEmbeddingResult(embedding=rows, num_tokens_per_frame=tuple(resolved.counts)),
                       video.modality)


def _learn_layouts(cache: EmbeddingCache, expected: Expected, modalities: set[str],
                   pending: dict[str, tuple]) -> None:
    """What the cache holds (or was declared to hold) for the videos' modalities, into
    ``expected``, as a planned step learns it: a learned layout binds once confirmed (a layout
    change not yet confirmed binds only what was declared). ``pending``: the layout of this
    call's other outputs per modality, cached just before the videos: what the cache does
    not know yet it learns from them."""
    known, sources = {}, {}
    for modality in modalities:
        changing = cache.layout_changing(modality)
        held = cache.layout_of(modality, declared_only=changing, confirmed_only=True)
        layout = held
        if not changing and modality in pending:
            layout = tuple(p if h is None else h for h, p in zip(held, pending[modality]))
        if layout != (None, None):
            known[modality] = layout
            sources[modality] = cache.layout_source(modality) if layout == held else \
                f"as this call's other {modality} rows have: they are cached together"
    if known:
        expected.learn_cache_layouts(known, [], sources)


class _PlannedRequests:
    """The call's requests without an EVS video, as one planned step whose cache insert
    waits for the videos: the call can still fail after it (ranks that pruned a video
    differently, a window that is wrong on one rank), and a failed call caches nothing,
    on any rank."""

    def __init__(self, plan: StepPlan, encoders: Callable, cache: EmbeddingCache | None, context: StepContext,
                 device: Any) -> None:
        self.cache, self.context = cache, context
        self.expected = expected = Expected(None, device)
        try:
            self.plan, ranks = agree_across_ranks(plan, expected, context)
            self.checked = ranks is None
            self.tensors, self.encoded = checked_rows(self.plan, encoders, cache, expected, move_features=True,
                                                      ranks=ranks)
            self.rows = self._assembled()
        finally:
            update_cache(cache, evict=expected.evict)

    def _assembled(self) -> Any:
        """The packed rows, copies in memory of the step's own (the videos' encoder calls
        may reuse the memory the outputs came in)."""
        try:
            return assemble_packed(self.plan, self.tensors, self.expected)
        except BaseException:
            if self.plan.has_hits:  # a bad entry is never served again
                self.expected.evict.extend(self.plan.hit_keys)
            raise

    def layouts(self) -> dict[str, tuple]:
        """``(hidden, dtype)`` of the encoded outputs per modality, which the cache learns
        from them when they are inserted."""
        out: dict[str, tuple] = {}
        for s in self.encoded:
            out.setdefault(self.plan.modalities[s], (self.tensors[s].shape[-1], self.tensors[s].dtype))
        return out

    def insert(self) -> None:
        """Cache what the step encoded, once the call stands."""
        try:
            insert_encoded(self.cache, self.plan, self.tensors, self.encoded, self.expected, checked=self.checked)
        except BaseException:
            # Refused, so the cache never looked for entries these outputs overwrote in a
            # reused buffer: they go now.
            if self.cache is not None and self.encoded:
                self.cache.discard_storages(written_memory([self.tensors[s] for s in self.encoded]))
            raise

    def acknowledge(self) -> None:
        acknowledge_hits(self.plan, self.context)


# -- the SGLang-compatible entry ----------------------------------------------------------


def get_embedding_and_mask(
    data_embedding_func: Callable,
    items: Sequence[Any],
    placeholder_tensor: Any,
    input_ids: Any,
    items_size: Sequence[int],
    prefixes: list[int],
    extends: list[int],
    offsets: list[Any],
    *,
    cache: EmbeddingCache | None,
    context: StepContext,
) -> tuple[Any, Any, Any]:
    """``sglang_compat.get_embedding_and_mask`` for a batch with EVS videos in it: rows in
    request order, the mask, and ``input_ids`` (a new tensor when a window was rewritten).
    The other requests take the ordinary path, batched across requests; the EVS ones are
    resolved one by one after them, the order SGLang calls the encoder in. Nothing is
    cached and no hit acknowledged before the whole call is valid, placeholder count
    included (it can only be checked after the rewrite): the other requests' outputs wait
    for the videos too."""
    n_requests = min(len(items_size) - 1, len(prefixes))
    pruned = set(pruned_video_requests(items, items_size, n_requests))
    device = input_ids.device
    chunks: dict[int, _Chunk] = {}
    plain = [i for i in range(n_requests) if i not in pruned and items_size[i] < items_size[i + 1]]
    planned = None
    if plain:
        plan = plan_columns(
            [items[items_size[i] : items_size[i + 1]] for i in plain], [prefixes[i] for i in plain],
            [extends[i] for i in plain], [offsets[i] for i in plain], [None] * len(plain), cache,
            context.max_tokens_per_encoder_call,
        )
        planned = _PlannedRequests(plan, data_embedding_func, cache, context, device)
    packed = None if planned is None else planned.rows
    cursor = 0
    for i in plain:
        n = count_mm_tokens_in_extend([prefixes[i]], [extends[i]], [offsets[i]])
        if n:
            chunks[i] = _Chunk(rows=packed[cursor : cursor + n])
            cursor += n

    encoder = as_encoder(data_embedding_func, move_features=True)  # SGLang's move, as for the others
    expected = Expected(packed.shape[-1] if packed is not None else None, device, "this chunk's other requests' rows")
    if cache is not None and pruned:
        _learn_layouts(cache, expected,
                       {modality_name(getattr(items[items_size[i]], "modality", "VIDEO")) for i in pruned},
                       {} if planned is None else planned.layouts())
    ranks = None
    if context.group is not None:
        from .ranks.videos import (
            video_ranks,  # loads torch.distributed: only for steps with a group
        )

        ranks = video_ranks(context)
    step = _VideoStep(encoder, cache, expected, ranks)
    try:
        step.resolve([(i, items[items_size[i] : items_size[i + 1]], prefixes[i], extends[i], offsets[i])
                      for i in sorted(pruned)])
        ids, rows, mask = step.place(chunks, input_ids, placeholder_tensor, extends, n_requests)
        inserts = step.to_insert()
        if planned is not None:
            planned.insert()  # every rank has placed the videos: the call stands
    finally:
        update_cache(cache, evict=expected.evict)
        if cache is not None and step.written:
            # Memory the encoder returned videos in, which its next call may have reused:
            # an entry holding it by reference was overwritten, step or no step.
            cache.discard_storages(step.written)
    try:
        update_cache(cache, insert=inserts)
    except CacheLayoutError as exc:  # another thread's step cached another layout meanwhile
        raise step.named(exc) from None
    if planned is not None:
        planned.acknowledge()
    hit_items = step.hit_items()
    if hit_items and context.on_cache_hit is not None:
        context.on_cache_hit(hit_items, context.parallel)
    return rows, mask, ids


class _VideoStep:
    """The EVS videos of one call, resolved in three phases (lookup, encode, place).

    On one rank a failure raises where it happens. With a process group each phase ends
    at a meeting point of the ranks (``mm_schedule.ranks.videos``): a local failure is
    recorded and raised on every rank there, so the ranks encode the same videos, in the
    same order, and either all change their caches or none does."""

    def __init__(self, encoder: Encoder, cache: EmbeddingCache | None, expected: Expected, ranks: Any) -> None:
        self.encoder, self.expected, self.ranks = encoder, expected, ranks
        self.lookup = None if cache is None else cache.get_single
        self.videos: dict[int, _PrunedVideo] = {}  # request -> its video, for windows that need one
        # A video shared by several requests is resolved once; the placeholder count is part
        # of the unit so that colliding hashes of different videos are never merged.
        self.units: dict[tuple[int, int], _PrunedVideo] = {}
        self.found: dict[tuple[int, int], _Resolved] = {}
        # This step's latest encoder output, still in the memory the encoder returned: the
        # encoder's next call may write into that same buffer, so it is copied first.
        self.in_encoder_memory: _Resolved | None = None
        self.written: set = set()  # the memory each encoded video came in (storage_id values)

    def _local(self, work: Callable[..., Any], video: _PrunedVideo | None, *args: Any) -> bool:
        """Run ``work``; with ranks, a failure is recorded for the next meeting point.
        Returns whether it succeeded (always True on one rank: failures raise)."""
        if self.ranks is not None and self.ranks.fault is not None:
            return False
        try:
            work(*args)
            return True
        except Exception as exc:
            if self.ranks is None:
                raise
            self.ranks.failed(exc, getattr(video, "index", None), getattr(video, "hash", None))
            return False

    def resolve(self, requests: Sequence[tuple]) -> None:
        """Every unit's rows and frame counts, from the cache or the encoder."""
        def check_and_look_up() -> None:
            for index, request_items, prefix, extend, offsets in requests:
                video = _PrunedVideo(index, request_items, prefix, extend, offsets)
                if video.needs_encoder():
                    self.videos[index] = video
                    self.units.setdefault((video.key, video.placeholders), video)
            for unit, video in self.units.items():
                hit = _cached(video, self.lookup, self.expected)
                if hit is not None:
                    self.found[unit] = hit

        self._local(check_and_look_up, None)
        units = list(self.units)
        if self.ranks is not None:
            agreed = self.ranks.agree([k for k, _ in units], [n for _, n in units], [u not in self.found for u in units])
            for unit, miss in zip(units, agreed):
                if miss:
                    self.found.pop(unit, None)  # held here but not everywhere: encoded again, like the others
        misses = [u for u in units if u not in self.found]
        owners = self.ranks.owners([n for _, n in misses]) if self.ranks is not None else [None] * len(misses)
        mine = {}
        for i, (unit, owner) in enumerate(zip(misses, owners)):
            if owner is None or owner == self.ranks.group.rank:
                if not self._local(self._encode, self.units[unit], self.units[unit], i, mine):
                    break
        if self.ranks is None or not misses:
            self.found.update((misses[i], r) for i, r in mine.items())
        else:
            shared = self.ranks.share_outputs(
                owners, [n for _, n in misses], {i: (r.rows, r.counts) for i, r in mine.items()},
                device=self.expected.device, check=lambda i, rows, counts: self._received(misses[i], rows, counts),
            )
            self.found.update((misses[i], _Resolved(rows, counts, False)) for i, (rows, counts) in shared.items())
        if self.ranks is not None:
            failed = self.ranks.fault is not None
            self.ranks.agree_frames([(self.units[u].index, self.units[u].hash, u[1], u[0]) for u in units],
                                    [None if failed or u not in self.found else self.found[u].counts or []
                                     for u in units], self.expected.evict)

    def _encode(self, video: _PrunedVideo, i: int, into: dict[int, _Resolved]) -> None:
        earlier = self.in_encoder_memory
        if earlier is not None:
            earlier.rows = earlier.rows.clone()
        resolved = into[i] = _encoded(video, self.encoder, self.expected, self.written)
        if self.encoder.copy_outputs:
            resolved.rows = resolved.rows.clone()
        else:
            self.in_encoder_memory = resolved
            self._check_hits_intact(video, resolved.rows)

    def _check_hits_intact(self, video: _PrunedVideo, rows: Any) -> None:
        """A hit of this step whose storage the encoder just wrote its output into lost
        its rows (an encoder reusing its buffer, cached by reference): never served."""
        storage = storage_id(rows)
        if storage is None:
            return
        for unit, hit in self.found.items():
            if hit.hit and storage_id(hit.rows) == storage:
                self.expected.evict.append(unit[0])
                owner = self.units[unit]
                raise CachedEmbeddingError(
                    f"request {owner.index}, item hash {owner.hash}: the encoder's output for request {video.index},"
                    f" item hash {video.hash} was written into the storage of this cached embedding (the encoder"
                    " reuses its output buffer), so the entry no longer holds its rows; it was evicted and will be"
                    " encoded again. Wrap the encoder as Encoder(fn, copy_outputs=True)"
                )

    def _received(self, unit: tuple[int, int], rows: Any, counts: Any) -> Any:
        video = self.units[unit]
        return video.rows_of(rows, video.frame_tokens(_Counts(counts)), self.expected)

    def place(self, chunks: dict[int, _Chunk], input_ids: Any, placeholder_tensor: Any, extends: Sequence[int],
              n_requests: int) -> tuple[Any, Any, Any]:
        """The rows of every window, ``input_ids`` rewritten, the checked mask."""
        out: dict[str, Any] = {"ids": input_ids, "rows": None, "mask": None}
        for index, video in self.videos.items():
            if not self._local(self._place, video, video, index, chunks):
                break
        rewritten = {i: c.window for i, c in chunks.items() if c.window is not None}
        if rewritten and self._local(self._check_windows, None, input_ids, rewritten, extends, n_requests, out):
            out["ids"] = _rewritten(input_ids, rewritten, out["starts"])
        self._local(self._check_mask, None, chunks, placeholder_tensor, out)
        if self.ranks is not None:
            self.ranks.finish()
        for video in self.videos.values():
            video.record_placement(self.found[video.key, video.placeholders].counts)
        return out["ids"], out["rows"], out["mask"]

    def _place(self, video: _PrunedVideo, index: int, chunks: dict[int, _Chunk]) -> None:
        found = self.found[video.key, video.placeholders]
        chunks[index] = video.chunk(found.rows, found.counts)
        video.check_placement(found.counts)

    def _check_windows(self, input_ids: Any, rewritten: dict[int, list[int]], extends: Sequence[int],
                       n_requests: int, out: dict[str, Any]) -> None:
        """The engine's tokens of every rewritten window against the processor's prompt
        (read where they live: on a device this would wait for it); ``out["starts"]``:
        the requests' starts in ``input_ids``."""
        starts = out["starts"] = _request_starts(input_ids, rewritten, extends, n_requests)
        if input_ids.device.type == "cpu":
            flat = input_ids.reshape(-1)
            for i in rewritten:
                video = self.videos[i]
                self._local(video.check_ids, video, flat[starts[i] : starts[i] + max(extends[i], 0)])

    def _check_mask(self, chunks: dict[int, _Chunk], placeholder_tensor: Any, out: dict[str, Any]) -> None:
        import torch

        order = [i for i in sorted(chunks) if chunks[i].rows is not None and chunks[i].rows.shape[0]]
        pieces = [chunks[i].rows for i in order]
        if pieces:
            if len(pieces) > 1:
                rows = torch.cat(pieces)
            elif order[0] in self.videos:
                # A video's rows are a view of a cache entry or of the encoder's output: the
                # caller gets its own memory, as from a planned step, which it may write in place.
                rows = pieces[0].clone()
            else:
                rows = pieces[0]  # the planned requests' packed rows: the caller's already
            out["rows"] = rows
            out["mask"] = checked_mask(out["ids"], placeholder_tensor, rows.shape[0])

    def to_insert(self) -> list[tuple[int, Any]]:
        """The encoded videos to cache, refused together (``CacheLayoutError``) when they
        disagree on a dtype: inserted one by one, the first would be cached and the rest
        refused against it."""
        out, first = [], {}
        for unit, found in self.found.items():
            if found.hit:
                continue
            video = self.units[unit]
            layout = (found.rows.shape[-1], found.rows.dtype)
            seen, seen_layout = first.setdefault(video.modality, (video, layout))
            if seen_layout != layout:
                raise CacheLayoutError(
                    f"request {video.index}, item hash {video.hash}: the video embedding has hidden size {layout[0]}"
                    f" and dtype {layout[1]}, request {seen.index}, item hash {seen.hash} of this step hidden size"
                    f" {seen_layout[0]} and dtype {seen_layout[1]}; one {video.modality} layout is cached. Nothing"
                    " of this step was cached",
                    key=video.key, modality=video.modality, got=layout, expected=seen_layout,
                )
            out.append((unit[0], _cache_value(video, found)))
        return out

    def named(self, exc: CacheLayoutError) -> CacheLayoutError:
        """The cache's refusal (which names a key) naming the request and item hash too."""
        video = next((v for (key, _), v in self.units.items() if key == exc.key), None)
        if video is None:
            return exc
        return CacheLayoutError(f"request {video.index}, item hash {video.hash}: {exc}", key=exc.key,
                                modality=exc.modality, got=exc.got, expected=exc.expected)

    def hit_items(self) -> list[Any]:
        return [v.item for v in self.videos.values() if self.found[v.key, v.placeholders].hit]


@dataclass
class _Counts:
    """Frame counts received from another rank, read by the same checks as an encoder's."""

    num_tokens_per_frame: Any


def _request_starts(input_ids: Any, rewritten: dict[int, list[int]], extend_length: Sequence[int],
                    n_requests: int) -> list[int]:
    """Where each request's tokens start in ``input_ids``, which must hold exactly the listed
    requests' extend tokens for a window to be rewritten in place."""
    starts, total = [], 0
    for i in range(n_requests):
        starts.append(total)
        total += max(extend_length[i], 0)
    if input_ids.numel() != total:
        first = min(rewritten)
        raise InvalidItemError(
            f"request {first}: EVS rewrites each request's tokens in input_ids, so input_ids must hold exactly"
            f" the listed requests' extend tokens ({total}); got {input_ids.numel()}"
        )
    return starts


def _rewritten(input_ids: Any, rewritten: dict[int, list[int]], starts: Sequence[int]) -> Any:
    import torch

    ids = input_ids.clone()
    for i, window in rewritten.items():
        ids[starts[i] : starts[i] + len(window)] = torch.tensor(window, dtype=ids.dtype, device=ids.device)
    return ids
