"""The device-side tile table: a segment table cut into even pieces of work.

Each segment is split on the host into tiles of at most ``BLOCK_M`` rows, and the kernel
runs one program per tile, so a 16384-row image next to a 1-row crop costs one launch
and no program does more than ``BLOCK_M`` rows. A tile is three int64 words::

    (address of the tile's first source row, first destination row, rows in the tile)

The table is built vectorised on the host, written into pinned memory and copied with
``non_blocking=True``; nothing waits for the device. A table may be given a fixed
``capacity`` (in tiles): unused tiles carry zero rows and do nothing, so a launch over
the whole capacity has a fixed grid and can be replayed from a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import SegmentError
from .segments import Segment

TILE_WORDS = 3


def count_tiles(segments: Sequence[Segment], block_m: int) -> int:
    return sum(-(-s.n_rows // block_m) for s in segments)


def host_tiles(
    segments: Sequence[Segment], base_addresses: Sequence[int], row_bytes: int, block_m: int
):
    """The ``[n_tiles, 3]`` int64 tile table (a CPU tensor) for already-checked segments."""
    import torch

    if not segments:
        return torch.empty((0, TILE_WORDS), dtype=torch.int64)
    seg = torch.tensor(segments, dtype=torch.int64)
    source, src_row, n_rows, dst_row = seg.unbind(1)
    tiles_per_seg = (n_rows + block_m - 1) // block_m
    seg_of_tile = torch.repeat_interleave(torch.arange(len(segments)), tiles_per_seg)
    first_tile = torch.cumsum(tiles_per_seg, 0) - tiles_per_seg
    row_offset = (torch.arange(seg_of_tile.numel()) - first_tile[seg_of_tile]) * block_m
    base = torch.tensor(list(base_addresses), dtype=torch.int64)[source]
    table = torch.empty((seg_of_tile.numel(), TILE_WORDS), dtype=torch.int64)
    table[:, 0] = base[seg_of_tile] + (src_row[seg_of_tile] + row_offset) * row_bytes
    table[:, 1] = dst_row[seg_of_tile] + row_offset
    table[:, 2] = torch.clamp(n_rows[seg_of_tile] - row_offset, max=block_m)
    return table


def upload(table, device, *, capacity: int | None = None, into=None):
    """Copy a host tile table to ``device`` without blocking the host.

    ``capacity`` pads with empty tiles; ``into`` reuses an existing device table of that
    capacity (its address stays fixed, which a captured CUDA graph needs).
    """
    import torch

    n_tiles = table.shape[0]
    if into is not None:
        capacity = into.shape[0]
    size = n_tiles if capacity is None else capacity
    if n_tiles > size:
        raise SegmentError(
            f"the segment table needs {n_tiles} tiles, the plan holds {size}; plan with a larger capacity"
        )
    pinned = device.type == "cuda"
    staging = torch.zeros((size, TILE_WORDS), dtype=torch.int64, pin_memory=pinned)
    staging[:n_tiles] = table
    if device.type == "cpu" and into is None:
        return staging
    if into is None:
        into = torch.empty((size, TILE_WORDS), dtype=torch.int64, device=device)
    # The caching host allocator keeps `staging` alive until this copy has run.
    into.copy_(staging, non_blocking=pinned)
    return into
