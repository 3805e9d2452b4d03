"""Kernels for the multimodal embedding path: segment gather and embedding merge.

Importing this package does not import torch or triton; they load on first use.
"""

from .segments import Segment, check_segments, total_rows

__all__ = ["Segment", "check_segments", "gather_segments", "merge_segments", "total_rows"]


def __getattr__(name):
    if name == "gather_segments":
        from .gather import gather_segments

        return gather_segments
    if name == "merge_segments":
        from .merge import merge_segments

        return merge_segments
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
