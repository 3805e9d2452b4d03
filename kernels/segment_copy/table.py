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
same stream is ordered after the copy. Per-call tables are staged in the device's
``staging.StagingRing`` (reused pinned and device buffers, no allocation per call); a
plan keeps its own pinned staging buffer for ``update`` (``upload``), reused once the
copy that last read it has completed.
"""

from __future__ import annotations

import ctypes
import sys
from array import array
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain
from struct import Struct

import torch

from .contract import SEGMENT_FIELDS, Segment

try:
    from . import _stream_copy
except ImportError:  # installed without a C compiler: packed in Python
    _stream_copy = None

HEADER_WORDS = 1
SEGMENT_WORDS = SEGMENT_FIELDS


def table_words(segments: Sequence[Segment], addresses: Sequence[int]) -> array:
    """The table as host words (for plans; ``build_table`` is the per-call form)."""
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


@lru_cache(maxsize=256)
def _packer(n_words: int) -> Struct:
    return Struct(f"{n_words}q")


# Lowest byte of each packed word (native order), and a map of bytes to their low four bits.
_LOW_BYTE = 0 if sys.byteorder == "little" else 7
_LOW_NIBBLE = bytes(b & 15 for b in range(256))


def pack_table(segments: Sequence[Segment], sources: Sequence) -> tuple[bytes, bool]:
    """The table's bytes for one call, and whether every source address is 16-byte aligned.

    The words are packed in one C call, and the alignment is read from the packed bytes
    with byte-string operations: a few nanoseconds per word."""
    n_segments, n_sources = len(segments), len(sources)
    size = HEADER_WORDS + SEGMENT_WORDS * n_segments + n_sources
    packed = _packer(size).pack(
        n_segments, *chain.from_iterable(segments), *map(torch.Tensor.data_ptr, sources)
    )
    first_address = (size - n_sources) * 8 + _LOW_BYTE
    aligned = not packed[first_address::8].translate(_LOW_NIBBLE).strip(b"\0")
    return packed, aligned


def build_table(segments: Sequence[Segment], sources: Sequence, device, ring=None):
    """The table for one call on ``device``, whether every source is 16-byte aligned, and
    the ``StagingRing`` slot it was staged in (None for CPU tensors: the words are the
    table). The caller calls ``slot.launched()`` after the launch that reads it."""
    if ring is None:
        packed, aligned = pack_table(segments, sources)
        return torch.frombuffer(bytearray(packed), dtype=torch.int64), aligned, None
    return stage_table(ring, segments, sources)


def stage_table(ring, segments: Sequence[Segment], sources: Sequence):
    """``(device table, every source 16-byte aligned, slot)`` staged in a slot of ``ring``
    (``staging.StagingRing``); the table is copied on the current stream."""
    n_words = table_size(len(segments), len(sources))
    slot = ring.claim(n_words)
    try:
        if _stream_copy is not None:
            # Packed by the C helper straight into the host buffer.
            aligned = _stream_copy.pack_table(slot.host_address, slot.words, segments, sources)[1]
        else:
            packed, aligned = pack_table(segments, sources)
            ctypes.memmove(slot.host_address, packed, len(packed))
        # The whole buffer: the kernel reads only as many words as the header says.
        slot.device.copy_(slot.host, non_blocking=True)
    except BaseException:
        slot.launched()  # nothing reads it: hand it back
        raise
    return slot.device, aligned, slot


def pinned_words(n_words: int):
    """A pinned host buffer of ``n_words`` int64 words (from torch's pinned-memory cache)."""
    return torch.empty(n_words, dtype=torch.int64, pin_memory=True)


def upload(words: array, device, *, staging=None, into=None):
    """A plan's table on ``device``, copied on the current stream.

    Off the CPU the words go through ``staging``, a pinned buffer of at least
    ``len(words)`` words (``pinned_words``) that no queued copy still reads: the plan
    keeps one for its updates. ``into`` rewrites an existing table in place (its address
    stays fixed, which a captured CUDA graph needs); it must be at least as long as
    ``words``.
    """

    host = torch.frombuffer(words, dtype=torch.int64)
    if device.type == "cpu":
        if into is None:
            return host
        into[: len(words)].copy_(host)
        return into
    staging = staging[: len(words)]
    staging.copy_(host)
    if into is None:
        return staging.to(device, non_blocking=True)
    into[: len(words)].copy_(staging, non_blocking=True)
    return into
