"""Segment gather: many source tensors -> one packed ``[n_rows, H]`` buffer.

Equivalent PyTorch::

    out = torch.cat([sources[s][r : r + n] for s, r, n, _ in segments])   # when dst rows are packed in order
"""

from __future__ import annotations

from collections.abc import Sequence

from .segments import Segment, check_segments, check_tensors, total_rows


def gather_segments_ref(sources: Sequence, segments: Sequence[Segment], out) -> None:
    """Plain-torch reference and CPU fallback: one ``copy_`` per segment."""
    for source, src_row, n_rows, dst_row in segments:
        out[dst_row : dst_row + n_rows].copy_(sources[source][src_row : src_row + n_rows])


def gather_segments(sources: Sequence, segments: Sequence[Segment], out=None, *, dtype=None):
    """Copy every segment into a packed destination and return it.

    ``out`` (optional) is written in place and must have at least as many rows as the
    table addresses; otherwise a buffer of ``total_rows(segments)`` rows is allocated
    in ``dtype`` (default: the first source's dtype). Bad tables raise before any copy.
    """
    import torch

    segments = [Segment(*s) for s in segments]
    if out is None:
        if not sources:
            raise ValueError("gather_segments needs out= when there are no sources")
        out = torch.empty(
            (total_rows(segments), sources[0].shape[-1]),
            dtype=dtype or sources[0].dtype,
            device=sources[0].device,
        )
    check_tensors(sources, out)
    check_segments(segments, [s.shape[0] for s in sources], out.shape[0])
    gather_segments_ref(sources, segments, out)
    return out
