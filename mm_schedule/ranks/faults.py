"""Agreeing on a step's outcome, so that a fault on one rank is a fault on all.

After encoding (whether it worked or raised), every rank joins one small all-gather of
``(failed, hidden, dtype code)``; checking the step's cache hits, before the ranks
agree on misses, reports its failures through the agreement vector instead. If any
rank failed, the ranks gather the failed ranks' descriptions (this second collective
runs only on that path) and all raise the same ``RankFaultError``, naming the first
failed rank, the request and the item hash.
The step's results are dropped before anything is inserted into a cache, so the next
step starts from the caches as they were.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RankFaultError
from .group import RankGroup


@dataclass(frozen=True)
class Fault:
    """What went wrong on one rank, small enough to send to the others."""

    rank: int
    request: int | None
    item_hash: int | None
    error: str  # the exception's class name
    message: str

    @classmethod
    def from_exception(
        cls, exc: BaseException, *, rank: int, request: int | None, item_hash: int | None
    ) -> Fault:
        # Our validation errors know the exact request and item; an encoder's own
        # exception only tells us which batch it was encoding.
        exc_request = getattr(exc, "request", None)
        exc_hash = getattr(exc, "item_hash", None)
        return cls(
            rank=rank,
            request=request if exc_request is None else exc_request,
            item_hash=item_hash if exc_hash is None else exc_hash,
            error=type(exc).__name__,
            message=str(exc),
        )

    def describe(self) -> str:
        return (
            f"rank {self.rank}: {self.error} while encoding request {self.request}, "
            f"item hash {self.item_hash}: {self.message}"
        )


def raise_agreed_fault(group: RankGroup, fault: Fault | None, cause: BaseException | None = None) -> None:
    """Once every rank knows that some rank failed: collect the descriptions and raise
    the same ``RankFaultError`` on every rank (the first failed rank's, naming the others)."""
    faults = group.all_gather_objects(fault, "collecting the failed ranks' errors")
    failed = [f for f in faults if f is not None]
    first = failed[0]
    message = first.describe()
    if len(failed) > 1:
        message += f" (ranks {[f.rank for f in failed[1:]]} failed in this step too)"
    raise RankFaultError(message, rank=first.rank, request=first.request, item_hash=first.item_hash) from cause


def settle(
    group: RankGroup,
    fault: Fault | None,
    *,
    hidden: int = 0,
    dtype_code: int = 0,
    cause: BaseException | None = None,
) -> tuple[int, int]:
    """Every rank calls this once per step with misses, failed or not. Returns the
    agreed ``(hidden, dtype code)`` of the encoder outputs (``(0, 0)`` when no rank
    produced any); raises ``RankFaultError`` on every rank if any rank failed or the
    ranks' outputs disagree in shape or dtype."""
    rows = group.all_gather_ints(
        [int(fault is not None), hidden, dtype_code], "agreeing on the step's encoder status"
    )
    if any(row[0] for row in rows):
        raise_agreed_fault(group, fault, cause)
    shapes = [(rank, (row[1], row[2])) for rank, row in enumerate(rows) if row[1]]
    odd = [rank for rank, shape in shapes if shape != shapes[0][1]]
    if odd:
        per_rank = ", ".join(f"rank {r}: hidden {h}, dtype code {c}" for r, (h, c) in shapes)
        raise RankFaultError(
            f"encoder outputs disagree across ranks ({per_rank})", rank=odd[0], request=None, item_hash=None
        )
    return shapes[0][1] if shapes else (0, 0)
