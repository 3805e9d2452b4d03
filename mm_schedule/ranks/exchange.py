"""Exchanging encoder rows between ranks, shares of different sizes included.

Every rank knows every share's row count from the agreed plan, so the exchange is one
``all_gather`` of buffers padded to the largest share (collectives need equal sizes
on every backend); each rank then slices the other ranks' rows out of what it got.
Balanced shares keep the padding small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .group import RankGroup
from .shards import shares

# Codes for the dtypes an encoder may return; the code travels in the status vector so
# every rank can allocate the receive buffers before the rows arrive.
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DTYPE_CODES = {dtype: code for code, dtype in enumerate(_DTYPES, start=1)}


def dtype_of(code: int) -> torch.dtype:
    return _DTYPES[code - 1]


def exchange_rows(
    group: RankGroup,
    owners: Sequence[int],
    rows: Sequence[int],
    mine: Mapping[int, torch.Tensor],
    *,
    hidden: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """All units' ``[rows, hidden]`` tensors on every rank.

    ``owners[i]`` is the rank that encoded unit ``i``; ``mine`` holds this rank's units.
    A rank's own units are returned as they are; the others are views of the gathered
    buffers (the cache clones such views on insert, so it never pins a whole buffer).
    """
    per_rank = shares(owners, group.size)
    capacity = max(sum(rows[i] for i in share) for share in per_rank)
    send = torch.empty(capacity, hidden, dtype=dtype, device=device)
    at = 0
    for i in per_rank[group.rank]:
        send[at : at + rows[i]].copy_(mine[i])
        at += rows[i]
    gathered = group.all_gather_rows(send, "exchanging encoder rows")
    out: list[torch.Tensor] = [None] * len(owners)  # type: ignore[list-item]
    for rank, share in enumerate(per_rank):
        at = 0
        for i in share:
            out[i] = mine[i] if rank == group.rank else gathered[rank][at : at + rows[i]]
            at += rows[i]
    return out
