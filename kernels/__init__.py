"""Kernels for the multimodal embedding path: segment gather and embedding merge.

- ``gather_segments`` / ``merge_segments``: a segment table over many source tensors,
  copied in one launch into a packed buffer or straight into ``input_embeds``;
  ``plan_segments`` / ``run_segments`` split the host work from the launch (CUDA graphs).
- ``merge_by_placeholder_ids`` / ``embed_with_placeholders``: the sync-free entry points
  for callers that only have ``input_ids``.
- ``gather_segments_op`` / ``merge_segments_op``: the same copies as ``torch.library``
  custom ops, callable from a model compiled with ``torch.compile``.
- ``copy_segments``, ``append_whole_sources``, ``first_overlap``: the scheduler's trusted
  copy, its streaming CPU append, and the overlap test of its planner.

The segment copy lives in ``segment_copy/`` (contract and checks, table, Triton kernel,
launchers, host copy, trusted path, custom ops); the placeholder merge in
``placeholder_merge.py``; launch configs in ``launch_config.py`` (heuristics) and
``tuned_configs.py`` (per-GPU files); ``registry.py`` lists both kernels.

Importing this package does not import torch or triton; they load on first use.
"""

if __name__ == "kernels":
    # Found under the top-level name, as only a source checkout's root on sys.path allows:
    # that name is Hugging Face's kernel-hub package (see _top_level_name.py).
    from ._top_level_name import hand_over

    hand_over()
else:
    from .segment_copy.contract import Segment, check_segments, first_overlap, total_rows

_LAZY = {
    "gather_segments": "segment_copy.launch",
    "gather_segments_ref": "segment_copy.launch",
    "plan_segments": "segment_copy.launch",
    "run_segments": "segment_copy.launch",
    "SegmentPlan": "segment_copy.launch",
    "merge_segments": "segment_copy.launch",
    "copy_segments": "segment_copy.trusted",
    "append_whole_sources": "segment_copy.host_copy",
    "merge_by_placeholder_ids": "placeholder_merge",
    "embed_with_placeholders": "placeholder_merge",
    "gather_segments_op": "segment_copy.custom_ops",
    "merge_segments_op": "segment_copy.custom_ops",
}

__all__ = ["Segment", "check_segments", "first_overlap", "total_rows", *_LAZY]


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
