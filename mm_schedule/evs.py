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

Beyond SGLang, which handles only a batch made of that one request: any number of
requests (EVS or not) share a batch, provided ``input_ids`` is exactly the listed
requests' extend tokens; a window that misses the video neither encodes nor rewrites
anything (the rewrite leaves the prompt outside the video as it was); every inconsistency
is a typed error naming the request and item hash, never a crop or a host-side assert.
Where ``input_ids`` cannot be rewritten (``embed_chunk``/``merge_chunk``, or a video
without its prompt ids) an EVS result is refused (``EncoderOutputError``): its rows
placed at the processor's positions would be silently wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .cache import EmbeddingCache, EmbeddingResult, owns_storage
from .context import StepContext
from .encode import Encoder, as_encoder, move_features_to
from .errors import EmbeddingLengthMismatch, EncoderOutputError, InvalidItemError
from .items import Span, check_spans, item_spans, modality_name, span_tokens
from .keys import combine_hashes, item_key
from .placeholders import checked_mask, count_mm_tokens_in_extend
from .plan import plan_columns
from .scheduler import run_packed, update_cache
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
        want = self.placeholders if counts is None else sum(counts)
        if rows.shape[0] != want:
            raise EmbeddingLengthMismatch(
                expected=want, received=rows.shape[0], request=self.index, item_hash=self.hash,
                what="video embedding rows" if counts is None else "pruned video rows (sum of num_tokens_per_frame)",
            )
        return rows

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
        try:
            setattr(self.item, _PLACED_WITH, now)
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


def _resolve(video: _PrunedVideo, encoder: Encoder, lookup: Callable | None, expected: Expected) -> _Resolved:
    """Rows and frame counts of the video: from the cache (``lookup``, read-only) when a
    valid entry is there, else from the encoder (validated; the caller caches it once the
    whole step is valid). An unfit entry is named in ``expected.evict``."""
    cached = lookup(video.key) if lookup is not None else None
    if cached is not None:
        try:
            counts = video.frame_tokens(cached)
            return _Resolved(video.rows_of(cached, counts, expected), counts, True)
        except (EmbeddingLengthMismatch, EncoderOutputError):
            expected.evict.append(video.key)  # another video under a colliding key, or a stale entry: encode again
    if encoder.move_features and expected.device is not None:
        move_features_to([video.item], expected.device)
    output = encoder([video.item])
    counts = video.frame_tokens(output)
    return _Resolved(video.rows_of(output, counts, expected), counts, False)


def _cache_value(resolved: _Resolved) -> Any:
    rows = resolved.rows.detach()
    if not owns_storage(rows):
        rows = rows.clone()  # an entry never pins the encoder's whole output buffer
    if resolved.counts is None:
        return EmbeddingResult(embedding=rows)
    return EVSEmbeddingResult(embedding=rows, num_tokens_per_frame=tuple(resolved.counts))


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
    resolved one by one after them, the order SGLang calls the encoder in. The pruned
    videos are cached and their hits acknowledged only once the whole step is valid,
    placeholder count included (it can only be checked after the rewrite)."""
    import torch

    n_requests = min(len(items_size) - 1, len(prefixes))
    pruned = set(pruned_video_requests(items, items_size, n_requests))
    device = input_ids.device
    chunks: dict[int, _Chunk] = {}
    plain = [i for i in range(n_requests) if i not in pruned and items_size[i] < items_size[i + 1]]
    packed = None
    if plain:
        plan = plan_columns(
            [items[items_size[i] : items_size[i + 1]] for i in plain], [prefixes[i] for i in plain],
            [extends[i] for i in plain], [offsets[i] for i in plain], [None] * len(plain), cache,
            context.max_tokens_per_encoder_call,
        )
        packed = run_packed(plan, data_embedding_func, cache, context, device=device, move_features=True).embedding
    cursor = 0
    for i in plain:
        n = count_mm_tokens_in_extend([prefixes[i]], [extends[i]], [offsets[i]])
        if n:
            chunks[i] = _Chunk(rows=packed[cursor : cursor + n])
            cursor += n

    encoder = as_encoder(data_embedding_func, move_features=True)  # SGLang's move, as for the others
    expected = Expected(packed.shape[-1] if packed is not None else None, device)
    # A video shared by several requests is resolved once; the placeholder count is part
    # of the key so that colliding hashes of different videos are never merged.
    by_key: dict[tuple[int, int], _Resolved] = {}
    hit_items = []
    lookup = None if cache is None else cache.get_single
    videos: dict[int, _PrunedVideo] = {}
    try:
        for i in sorted(pruned):
            video = _PrunedVideo(i, items[items_size[i] : items_size[i + 1]], prefixes[i], extends[i], offsets[i])
            if not video.needs_encoder():
                continue
            found = by_key.get((video.key, video.placeholders))
            if found is None:
                found = by_key[video.key, video.placeholders] = _resolve(video, encoder, lookup, expected)
            chunks[i] = video.chunk(found.rows, found.counts)
            videos[i] = video
            video.check_placement(found.counts)
            if found.hit:
                hit_items.append(video.item)
        ids = _rewrite_windows(input_ids, chunks, extends, n_requests, videos)
        pieces = [chunks[i].rows for i in sorted(chunks) if chunks[i].rows is not None and chunks[i].rows.shape[0]]
        rows = mask = None
        if pieces:
            rows = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
            mask = checked_mask(ids, placeholder_tensor, rows.shape[0])
    finally:
        update_cache(cache, evict=expected.evict)
    update_cache(cache, insert=[(key, _cache_value(found)) for (key, _), found in by_key.items() if not found.hit])
    if hit_items and context.on_cache_hit is not None:
        context.on_cache_hit(hit_items, context.parallel)
    return rows, mask, ids


def _rewrite_windows(input_ids: Any, chunks: dict[int, _Chunk], extend_length: Sequence[int], n_requests: int,
                     videos: dict[int, _PrunedVideo]) -> Any:
    rewritten = {i: c.window for i, c in chunks.items() if c.window is not None}
    if not rewritten:
        return input_ids
    import torch

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
    if input_ids.device.type == "cpu":  # read where it lives; on a device this would wait for it
        flat = input_ids.reshape(-1)
        for i in rewritten:
            videos[i].check_ids(flat[starts[i] : starts[i] + max(extend_length[i], 0)])
    ids = input_ids.clone()
    for i, window in rewritten.items():
        ids[starts[i] : starts[i] + len(window)] = torch.tensor(window, dtype=ids.dtype, device=ids.device)
    return ids
