"""Fused merge: segments written straight into ``input_embeds`` at the placeholder rows.

No packed intermediate buffer, no boolean mask, no host sync: the scheduler already knows
where every multimodal row goes, so the segment table's ``dst_row`` is the row of
``input_embeds`` (flattened over the batch) and the gather kernel writes there directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from .gather import copy_checked


def merge_segments(
    sources: Sequence, segments: Sequence, input_embeds, *, config: dict | None = None
):
    """Write every segment into ``input_embeds`` (in place, cast to its dtype) and return it.

    ``input_embeds`` is ``[tokens, H]``; rows no segment names keep their text embedding.
    A source sharing memory with ``input_embeds`` raises ``SourceOverlapError``.

    Equivalent PyTorch::

        for s, r, n, d in segments:
            input_embeds[d : d + n] = sources[s][r : r + n].to(input_embeds.dtype)

    Not for CUDA-graph capture (``GraphCaptureError``): plan with
    ``gather.plan_segments(..., capacity=N)`` and ``input_embeds`` as the destination,
    then capture ``gather.run_segments``.
    """
    copy_checked(sources, segments, input_embeds, config=config, what="merge_segments")
    return input_embeds
