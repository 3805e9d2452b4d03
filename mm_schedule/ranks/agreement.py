"""Agreeing on a step's cache misses: one small all-reduce.

Each rank plans the step against its own cache, then contributes, for every distinct
key of the step (in plan order), 1 if it missed and 0 if it hit. The MAX over ranks is
the agreed miss set: a key is a hit only where every rank holds it.

An entry one rank holds and another lacks is therefore a miss everywhere: it is
encoded again (or, with encoder parallelism, by its owner) and the fresh rows replace
the old entry on every rank that inserts it. Every rank then assembles the step from
the same rows, and a rank that served the old copy cannot drift from one that did not.

The same vector carries a header: the maximum and the negated minimum of a
fingerprint of the step (keys, rows, group size, settings) and of the key count, so
ranks planning different batches are caught by the same collective, and a flag for a
rank that already failed (a cached entry unfit for the step). It has a fixed
length (2 KiB) so that ranks which disagree on the key count still exchange buffers of
one size; a step with more distinct keys than fit sends the rest in a second
all-reduce, whose length every rank then knows.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import RankMismatchError
from .group import RankGroup

_HEADER = 5
FIRST_ROUND_KEYS = 256 - _HEADER
_FINGERPRINT_BITS = (1 << 62) - 1  # leaves room to negate within int64


def step_fingerprint(keys: Sequence[int], rows: Sequence[int], settings: Sequence[int]) -> int:
    # hash() of a tuple of ints is the same in every process of one Python build. Only
    # ints may go in (the planner's keys and rows are ints): str and bytes hashes are
    # salted per process, and before Python 3.12 hash(None) is an address.
    return hash((tuple(keys), tuple(rows), tuple(settings))) & _FINGERPRINT_BITS


def agree_misses(
    group: RankGroup,
    keys: Sequence[int],
    rows: Sequence[int],
    local_miss: Sequence[bool],
    *,
    settings: Sequence[int] = (),
    failed: bool = False,
) -> tuple[list[bool], bool]:
    """The agreed miss flag of each key, identical on every rank of ``group``, and
    whether any rank reported ``failed`` (a local failure found before agreeing).
    ``settings`` (ints) must be equal on every rank, like the keys and rows."""
    n = len(keys)
    fp = step_fingerprint(keys, rows, (group.size, *settings))
    first = list(map(int, local_miss[:FIRST_ROUND_KEYS]))
    first += [0] * (FIRST_ROUND_KEYS - len(first))
    out = group.all_reduce_max([fp, -fp, n, -n, int(failed), *first], "agreeing on the step's cache misses")
    if out[4]:
        return [], True
    if out[0] != -out[1] or out[2] != -out[3]:
        raise RankMismatchError(
            "the ranks of the process group planned different steps "
            f"(distinct keys per rank range from {-out[3]} to {out[2]}; step fingerprints differ: "
            f"{out[0] != -out[1]}); every rank must schedule the same batch with the same settings"
        )
    flags = out[_HEADER : _HEADER + min(n, FIRST_ROUND_KEYS)]
    if n > FIRST_ROUND_KEYS:
        rest = list(map(int, local_miss[FIRST_ROUND_KEYS:]))
        flags += group.all_reduce_max(rest, "agreeing on the step's cache misses (keys beyond the first round)")
    return list(map(bool, flags)), False
