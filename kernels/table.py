"""The device-side segment table: the scheduler's segments as they are, plus addresses.

One flat int64 array, built on the host with no per-tile work::

    [n_segments,
     source, src_row, n_rows, dst_row,     # segment 0, exactly as given
     ...,
     address of source 0, address of source 1, ...]

The kernel cuts segments into tiles of at most ``BLOCK_M`` rows itself: program ``t``
finds its segment from a running sum of ``ceil(n_rows / BLOCK_M)`` over the table, so a
16384-row image next to a 1-row crop costs one launch, no program does more than
``BLOCK_M`` rows, and the host never expands tiles. The grid only needs an upper bound
on the tile count (``grid_bound``); programs past the last tile copy nothing.

The header word also makes a plan's table rewritable in place: ``SegmentPlan.update``
changes the number of segments without touching the (possibly graph-captured) launch.

Uploads happen on the stream current at the call, inside the destination's device
guard, from pinned memory with ``non_blocking=True``; the launch that follows on the
same stream is ordered after the copy.
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Sequence
from itertools import chain

from .segments import Segment

HEADER_WORDS = 1
SEGMENT_WORDS = 4


def table_words(segments: Sequence[Segment], addresses: Sequence[int]) -> array:
    words = array("q", (len(segments),))
    words.extend(chain.from_iterable(segments))
    words.extend(addresses)
    return words


def table_size(n_segments: int, n_sources: int) -> int:
    return HEADER_WORDS + SEGMENT_WORDS * n_segments + n_sources


def count_tiles(segments: Sequence[Segment], block_m: int) -> int:
    return sum(-(-s[2] // block_m) for s in segments)


def grid_bound(total_rows: int, n_segments: int, block_m: int) -> int:
    """At least ``count_tiles``: each segment adds less than one partial tile."""
    return (total_rows + n_segments * (block_m - 1)) // block_m


def upload(words: array, device, *, into=None):
    """The table as an int64 tensor on ``device``, copied on the current stream.

    ``into`` rewrites an existing table in place (its address stays fixed, which a
    captured CUDA graph needs); it must be at least as long as ``words``.
    """
    import torch

    host = torch.frombuffer(words, dtype=torch.int64)
    if device.type == "cpu":
        if into is None:
            return host
        into[: len(words)].copy_(host)
        return into
    # Pinned staging: the caching host allocator keeps it until the copy has run.
    staging = torch.empty(len(words), dtype=torch.int64, pin_memory=True)
    ctypes.memmove(staging.data_ptr(), words.buffer_info()[0], len(words) * words.itemsize)
    if into is None:
        into = torch.empty(len(words), dtype=torch.int64, device=device)
        into.copy_(staging, non_blocking=True)
    else:
        into[: len(words)].copy_(staging, non_blocking=True)
    return into
