"""Which rank encodes which miss: a deterministic split balanced by token count.

Every rank runs this on the agreed miss list, so every rank computes the same owners
without talking. Encoder cost grows with tokens (rows), not items: one video of 40
frames weighs as much as 40 images, so counting items would leave one rank doing
most of the work.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def assign_shards(tokens: Sequence[int], world: int) -> list[int]:
    """Owner rank of each unit, given each unit's token count.

    Longest first onto the least-loaded rank (the LPT rule: never worse than 4/3 of
    the optimal makespan). Ties break by plan position for units and by rank number
    for ranks, so the answer depends on nothing but the arguments.
    """
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    owners = [0] * len(tokens)
    if world == 1:
        return owners
    order = sorted(range(len(tokens)), key=lambda i: (-tokens[i], i))
    loads = [(0, rank) for rank in range(world)]  # (tokens assigned, rank): a min-heap
    for i in order:
        load, rank = heapq.heappop(loads)
        owners[i] = rank
        heapq.heappush(loads, (load + tokens[i], rank))
    return owners


def shares(owners: Sequence[int], world: int) -> list[list[int]]:
    """Unit indices per rank, each list in plan order (the order rows are exchanged in)."""
    out: list[list[int]] = [[] for _ in range(world)]
    for i, rank in enumerate(owners):
        out[rank].append(i)
    return out
