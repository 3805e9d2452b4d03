"""Fused merge: segments written straight into ``input_embeds`` at placeholder rows.

Equivalent PyTorch::

    for s, r, n, d in segments:
        input_embeds[d : d + n] = sources[s][r : r + n].to(input_embeds.dtype)
"""

from __future__ import annotations

from collections.abc import Sequence

from .gather import gather_segments_ref
from .segments import Segment, check_segments, check_tensors


def merge_segments(sources: Sequence, segments: Sequence[Segment], input_embeds):
    """Write every segment into ``input_embeds`` (in place) and return it."""
    segments = [Segment(*s) for s in segments]
    check_tensors(sources, input_embeds)
    check_segments(segments, [s.shape[0] for s in sources], input_embeds.shape[0])
    gather_segments_ref(sources, segments, input_embeds)
    return input_embeds
