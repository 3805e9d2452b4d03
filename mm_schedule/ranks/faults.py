"""Agreeing on a step's outcome, so that a fault on one rank is a fault on all.

After encoding (whether it worked or raised), every rank joins one small all-gather of
``(failed, hidden and dtype code per modality)``; checking the step's cache hits, before the ranks
agree on misses, reports its failures through the agreement vector instead. If any
rank failed, the ranks gather the failed ranks' descriptions (this second collective
runs only on that path) and all raise the same ``RankFaultError``, naming the first
failed rank, the request and the item hash.
The step's results are dropped before anything is inserted into a cache, so the next
step starts from the caches as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    shapes: Sequence[tuple[int, int]],
    *,
    labels: Sequence[str] = (),
    cause: BaseException | None = None,
) -> list[tuple[int, int]]:
    """Every rank calls this once per step with misses, failed or not.

    ``shapes[k]`` is this rank's ``(hidden, dtype code)`` for output kind ``k`` (the
    step's modalities, named by ``labels``), ``(0, 0)`` where it produced none; every
    rank passes the same number. Returns the agreed shape per kind; raises
    ``RankFaultError`` on every rank if any rank failed or the ranks' outputs of one
    kind disagree in hidden size or dtype."""
    rows = group.all_gather_ints(
        [int(fault is not None), *(v for shape in shapes for v in shape)], "agreeing on the step's encoder status"
    )
    if any(row[0] for row in rows):
        raise_agreed_fault(group, fault, cause)
    agreed = []
    for k in range(len(shapes)):
        produced = [(rank, (row[1 + 2 * k], row[2 + 2 * k])) for rank, row in enumerate(rows) if row[1 + 2 * k]]
        odd = [rank for rank, shape in produced if shape != produced[0][1]]
        if odd:
            per_rank = ", ".join(f"rank {r}: hidden {h}, dtype code {c}" for r, (h, c) in produced)
            what = f"{labels[k]} " if k < len(labels) else ""
            raise RankFaultError(
                f"{what}encoder outputs disagree across ranks ({per_rank})", rank=odd[0], request=None, item_hash=None
            )
        agreed.append(produced[0][1] if produced else (0, 0))
    return agreed
