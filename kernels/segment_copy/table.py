"""The device-side segment table: the scheduler's segments as they are, plus where each
one's tiles end and the source addresses.

One flat int64 array, built on the host in one pass over the segments::

    [n_segments,
     tile_end[0], ..., tile_end[n_segments - 1],   # tiles of segments 0..i, cumulative
     source, src_row, n_rows, dst_row,            # segment 0, exactly as given
     ...,
     address of source 0, address of source 1, ...]

A segment of ``n_rows`` rows is cut into ``ceil(n_rows / BLOCK_M)`` tiles of at most
``BLOCK_M`` rows, one program each; program ``t`` finds its segment by a binary search of
``tile_end`` (``log2(n_segments)`` scalar loads, no program reads the whole table), so a
16384-row image next to a 1-row crop costs one launch and no program does more than
``BLOCK_M`` rows. ``BLOCK_M`` comes from the rows the table copies (not the
destination's), which the packer counts in the same pass: it asks the launcher for the
tile height of that row count, then writes the cumulative counts; the grid is the last
one, the tiles with work exactly.

The header word also makes a plan's table rewritable in place: ``SegmentPlan.update``
changes the number of segments without touching the (possibly graph-captured) launch;
programs past the last tile copy nothing and read no record.

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
from itertools import accumulate, chain
from struct import Struct

import torch

from .contract import SEGMENT_FIELDS, Segment

try:
    from . import _stream_copy
except ImportError:  # installed without a C compiler: packed in Python
    _stream_copy = None

HEADER_WORDS = 1
SEGMENT_WORDS = SEGMENT_FIELDS + 1  # the fields and the cumulative tile count


def tile_ends(segments: Sequence[Segment], block_m: int) -> list[int]:
    """Tiles of segments ``0..i``, for every ``i`` (the table's search column); a segment
    of no rows has none."""
    return list(accumulate(max(0, -(-s[2] // block_m)) for s in segments))


def table_words(segments: Sequence[Segment], addresses: Sequence[int], block_m: int) -> array:
    """The table as host words (for plans; ``build_table`` is the per-call form)."""
    words = array("q", (len(segments),))
    words.extend(tile_ends(segments, block_m))
    words.extend(chain.from_iterable(segments))
    words.extend(addresses)
    return words


def table_size(n_segments: int, n_sources: int) -> int:
    return HEADER_WORDS + SEGMENT_WORDS * n_segments + n_sources


def count_tiles(segments: Sequence[Segment], block_m: int) -> int:
    return sum(-(-s[2] // block_m) for s in segments)


@lru_cache(maxsize=256)
def _packer(n_words: int) -> Struct:
    return Struct(f"{n_words}q")


# Lowest byte of each packed word (native order), and a map of bytes to their low four bits.
_LOW_BYTE = 0 if sys.byteorder == "little" else 7
_LOW_NIBBLE = bytes(b & 15 for b in range(256))


def pack_table(segments: Sequence[Segment], sources: Sequence, block_m_for) -> tuple[bytes, bool, int, int]:
    """The table's bytes for one call, whether every source address is 16-byte aligned,
    the rows it copies and its tiles of ``block_m_for(rows)`` rows (the Python form of
    the C packer, for builds without it).

    The alignment is read from the packed bytes with byte-string operations: a few
    nanoseconds per word."""
    n_segments, n_sources = len(segments), len(sources)
    rows = sum(max(0, s[2]) for s in segments)
    ends = tile_ends(segments, block_m_for(rows))
    size = HEADER_WORDS + SEGMENT_WORDS * n_segments + n_sources
    packed = _packer(size).pack(
        n_segments, *ends, *chain.from_iterable(segments), *map(torch.Tensor.data_ptr, sources)
    )
    first_address = (size - n_sources) * 8 + _LOW_BYTE
    aligned = not packed[first_address::8].translate(_LOW_NIBBLE).strip(b"\0")
    return packed, aligned, rows, ends[-1] if ends else 0


def build_table(segments: Sequence[Segment], sources: Sequence, device, ring, block_m_for):
    """``(table, every source 16-byte aligned, slot, rows copied, tiles)`` for one call on
    ``device``: ``block_m_for(rows)`` is the tile height the launch will use for the
    table's row count. ``ring`` is the device's ``StagingRing`` (None for CPU tensors:
    the words are the table, and no slot is returned); the caller calls
    ``slot.launched()`` after the launch that reads it."""
    if ring is None:
        packed, aligned, rows, tiles = pack_table(segments, sources, block_m_for)
        return torch.frombuffer(bytearray(packed), dtype=torch.int64), aligned, None, rows, tiles
    return stage_table(ring, segments, sources, block_m_for)


def whole_table(rows: list, addresses: list, ring, block_m: int, *, host=None):
    """``build_table``'s result for whole sources in order (segment ``i`` all of source ``i``,
    in the packed layout) given by their row counts and first-row addresses, for tiles of
    ``block_m`` rows: no tensor is read. ``ring`` as ``build_table`` takes it; without one
    the table is ``host(n_words)`` (an int64 CPU tensor of that many words), by default a
    new one."""
    n_words = table_size(len(rows), len(addresses))
    slot = ring.claim(n_words) if ring is not None else None
    try:
        if slot is not None:
            words = slot.host
        else:
            words = host(n_words) if host is not None else torch.empty(n_words, dtype=torch.int64)
        if _stream_copy is not None:
            _, aligned, total, tiles = _stream_copy.pack_whole(words.data_ptr(), words.numel(), rows, addresses,
                                                               block_m)
        else:
            aligned, total, tiles = _pack_whole_py(words, rows, addresses, block_m)
        if slot is None:
            return words, aligned, None, total, tiles
        slot.device.copy_(slot.host, non_blocking=True)
    except BaseException:
        if slot is not None:
            slot.launched()  # nothing reads it: hand it back
        raise
    return slot.device, aligned, slot, total, tiles


def _pack_whole_py(words, rows: list, addresses: list, block_m: int) -> tuple[bool, int, int]:
    """The C ``pack_whole`` in Python, for builds without the C helper."""
    n = len(rows)
    starts = list(accumulate(rows, initial=0))
    total = starts.pop()
    segments = [(i, 0, r, d) for i, (r, d) in enumerate(zip(rows, starts))]
    packed = table_words(segments, addresses, block_m)
    words[: len(packed)].copy_(torch.frombuffer(packed, dtype=torch.int64))
    return all(a % 16 == 0 for a in addresses), total, packed[n] if n else 0


def stage_table(ring, segments: Sequence[Segment], sources: Sequence, block_m_for):
    """``(device table, every source 16-byte aligned, slot, rows, tiles)`` as
    ``build_table`` returns them, staged in a slot of ``ring`` (``staging.StagingRing``);
    the table is copied on the current stream."""
    n_words = table_size(len(segments), len(sources))
    slot = ring.claim(n_words)
    try:
        if _stream_copy is not None:
            # Packed by the C helper straight into the host buffer.
            _, aligned, rows, tiles = _stream_copy.pack_table(
                slot.host_address, slot.words, segments, sources, block_m_for
            )
        else:
            packed, aligned, rows, tiles = pack_table(segments, sources, block_m_for)
            ctypes.memmove(slot.host_address, packed, len(packed))
        # The whole buffer: the kernel reads only as many words as the header says.
        slot.device.copy_(slot.host, non_blocking=True)
    except BaseException:
        slot.launched()  # nothing reads it: hand it back
        raise
    return slot.device, aligned, slot, rows, tiles


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
