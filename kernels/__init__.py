"""Kernels for the multimodal embedding path: segment gather and embedding merge.

- ``gather_segments`` / ``merge_segments``: a segment table over many source tensors,
  copied in one launch into a packed buffer or straight into ``input_embeds``;
  ``plan_segments`` / ``run_segments`` split the host work from the launch (CUDA graphs).
- ``merge_by_placeholder_ids`` / ``embed_with_placeholders``: the sync-free entry points
  for callers that only have ``input_ids``.
- ``gather_segments_op`` / ``merge_segments_op``: the same copies as ``torch.library``
  custom ops, callable from a model compiled with ``torch.compile``.

Importing this package does not import torch or triton; they load on first use.
"""

from .segments import Segment, check_segments, total_rows

_LAZY = {
    "gather_segments": "gather",
    "gather_segments_ref": "gather",
    "plan_segments": "gather",
    "run_segments": "gather",
    "SegmentPlan": "gather",
    "merge_segments": "segment_merge",
    "merge_by_placeholder_ids": "placeholder_merge",
    "embed_with_placeholders": "placeholder_merge",
    "gather_segments_op": "custom_ops",
    "merge_segments_op": "custom_ops",
}

__all__ = ["Segment", "check_segments", "total_rows", *_LAZY]


def __getattr__(name):
    """Load the op module on first access and keep the attribute, so later lookups are
    plain module-global reads that never come back here."""
    if name in _LAZY:
        import importlib

        from mm_schedule import _needs_torch

        with _needs_torch(f"{__name__}.{name}"):
            value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
