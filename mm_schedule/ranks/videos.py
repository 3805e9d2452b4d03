"""Ranks of a process group resolving the EVS videos of a step together.

An EVS video is resolved outside the planned step (its rows decide where its
placeholders go), but it meets the ranks at the same three points as every planned
item, through the same collectives:

1. ``agree``: each rank's cache hits and misses of the step's videos are agreed (a
   video is a hit only where every rank holds a valid entry), and a rank that failed
   before encoding (a malformed video, say) makes every rank raise the same error. So
   all ranks call the encoder for the same videos in the same order, which a
   tensor-parallel vision tower needs to not hang.
2. ``share_outputs``: after this rank encoded its videos (all agreed misses, or with
   encoder parallelism its share), the ranks settle the outcome, and in parallel mode
   exchange the rows and frame counts, so every rank holds every video's result.
   Then ``agree_frames``: every video's frame counts (from the cache or the encoder)
   must be the same on every rank, or every rank evicts the video and raises
   ``RankFaultError``.
3. ``finish``: after the rewrite of ``input_ids`` and the placeholder check, a fault
   on any rank is raised on all, before any rank changes its cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import EncoderOutputError, RankFaultError
from .agreement import agree_misses
from .exchange import DTYPE_CODES, dtype_of, exchange_rows
from .faults import Fault, raise_agreed_fault, settle
from .group import RankGroup, step_group
from .shards import assign_shards

_VIDEO = "VIDEO"


class VideoRanks:
    """One step's EVS videos in a process group (a new one per step)."""

    def __init__(self, group: RankGroup, *, encoder_parallel: bool) -> None:
        self.group = group
        self.encoder_parallel = encoder_parallel
        self.fault: Fault | None = None
        self.cause: BaseException | None = None

    def failed(self, exc: BaseException, request: int | None, item_hash: Any) -> None:
        """Record this rank's failure; it is raised on every rank at the next meeting point."""
        self.fault = Fault.from_exception(exc, rank=self.group.rank, request=request, item_hash=item_hash)
        self.cause = exc

    def _raise_if_anyone_failed(self, shapes: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
        return settle(self.group, self.fault, shapes, labels=[_VIDEO] * len(shapes), cause=self.cause)

    def agree(self, keys: Sequence[int], rows: Sequence[int], local_miss: Sequence[bool]) -> list[bool]:
        """The agreed miss flag of every video (identical on every rank)."""
        flags, someone_failed = agree_misses(
            self.group, keys, rows, local_miss, settings=(int(self.encoder_parallel), 1), failed=self.fault is not None
        )
        if someone_failed:
            raise_agreed_fault(self.group, self.fault, self.cause)
        return flags

    def owners(self, rows: Sequence[int]) -> list[int]:
        """The rank that encodes each agreed miss: every rank without encoder parallelism."""
        if not self.encoder_parallel:
            return [self.group.rank] * len(rows)
        return assign_shards(rows, self.group.size)

    def share_outputs(
        self,
        owners: Sequence[int],
        rows: Sequence[int],
        mine: dict[int, tuple[Any, Any]],
        *,
        device: Any,
        check: Callable[[int, Any, Any], Any],
    ) -> dict[int, tuple[Any, Any]]:
        """Every agreed miss's ``(rows tensor, frame counts)``, given this rank's own in
        ``mine`` (by miss index). Raises the agreed fault on every rank when any rank
        failed or the ranks' outputs differ in hidden size or dtype. ``check(i, rows,
        counts)`` validates what another rank sent for miss ``i``."""
        shape = (0, 0)
        if self.fault is None and mine:
            first = next(iter(mine.values()))[0]
            shape = (first.shape[-1], DTYPE_CODES.get(first.dtype, 0))
            if self.encoder_parallel and shape[1] == 0:
                self.failed(EncoderOutputError(
                    f"encoder-parallel steps exchange EVS video rows in one of {', '.join(map(str, DTYPE_CODES))};"
                    f" the encoder returned {first.dtype}"), None, None)
                shape = (0, 0)
        (hidden, code), = self._raise_if_anyone_failed([shape])
        if not self.encoder_parallel:
            return mine
        counts = self.group.all_gather_objects({i: c for i, (_, c) in mine.items()}, "exchanging EVS frame counts")
        if code == 0:  # no rank encoded anything
            return mine
        tensors = {i: t for i, (t, _) in mine.items()}
        received = exchange_rows(self.group, owners, rows, tensors, hidden=hidden, dtype=dtype_of(code), device=device)
        out = {}
        for i, (owner, t) in enumerate(zip(owners, received)):
            if owner == self.group.rank:
                out[i] = mine[i]
                continue
            got = counts[owner][i]
            try:
                out[i] = (check(i, t, got), got)
            except Exception as exc:  # raised on every rank by finish()
                self.failed(exc, None, None)
                break
        return out

    def agree_frames(self, units: Sequence[tuple[int, Any, int, int]], counts: Sequence[Any],
                     evict: list[int]) -> None:
        """Every video's frame counts (``counts[i]`` for ``units[i]``, its ``(request, item
        hash, placeholder tokens, cache key)``; None where this rank has none) must be the
        same on every rank: the counts decide where each rank moves the video's
        placeholders, so ranks that pruned one video differently would build different
        ``input_ids``. Raises ``RankFaultError`` on every rank alike (they all compare the
        same gathered lists), before any cache changes but one: every rank names the
        disagreeing videos' keys in ``evict``, as entries that may not be served. Cached
        entries that disagree would otherwise be agreed hits at every later step, and fail
        every one of them."""
        mine = [None if c is None else [int(x) for x in c] for c in counts]
        every = self.group.all_gather_objects(mine, "agreeing on EVS frame counts")
        if any(len(theirs) != len(mine) or None in theirs for theirs in every):
            return  # a rank failed before it knew every count: finish() raises its fault everywhere
        divergent = [i for i, first in enumerate(every[0]) if any(theirs[i] != first for theirs in every)]
        if not divergent:
            return
        evict.extend(units[i][3] for i in divergent)
        i = divergent[0]
        request, item_hash, tokens, _ = units[i]
        per_rank = ", ".join(f"rank {r}: {theirs[i]}" for r, theirs in enumerate(every))
        odd = next(r for r, theirs in enumerate(every) if theirs[i] != every[0][i])
        more = f" (and {len(divergent) - 1} more of this step's videos, evicted too)" if len(divergent) > 1 else ""
        raise RankFaultError(
            f"request {request}, EVS video item hash {item_hash!r} ({tokens} placeholder tokens): the ranks"
            f" pruned it to different frame token counts ({per_rank}){more}, so their input_ids would differ;"
            " nothing of this step was cached, and every rank evicted the video, so the next step encodes it again",
            rank=odd, request=request, item_hash=item_hash,
        )

    def finish(self) -> None:
        """The last meeting point of the step: a fault anywhere is raised everywhere."""
        self._raise_if_anyone_failed()


def video_ranks(context: Any) -> VideoRanks | None:
    """The coordinator for a step's EVS videos, or None when the step runs on one rank."""
    group = step_group(context)
    return None if group is None else VideoRanks(group, encoder_parallel=context.encoder_parallel)
