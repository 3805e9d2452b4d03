"""The segment gather and merge as ``torch.library`` custom ops, for ``torch.compile``.

A compiled model cannot trace into a Triton launcher that reads tensor addresses on the
host; it can call an opaque custom op whose output shape it learns from a fake (meta)
implementation. Registered here, on first import of this module:

- ``torch.ops.mm_schedule.gather_segments(sources, segments, rows, dtype)`` returns a new
  ``[rows, H]`` tensor (``dtype`` None: the sources' dtype; no sources: ``[rows, 0]``
  float32); rows no segment names are zero, so the result never depends on
  uninitialised memory;
- ``torch.ops.mm_schedule.merge_segments_(sources, segments, input_embeds)`` writes into
  ``input_embeds`` in place (declared through ``mutates_args``) and returns nothing.

``segments`` is a flat int64 CPU tensor ``[source, src_row, n_rows, dst_row, ...]`` (four
words per segment). A tensor, not a list: Dynamo guards a list's length, so every new
segment count would compile the model again (and past ``recompile_limit``, 8, fall back
to eager), while a tensor's length becomes a symbolic size after the first change: a
model fed tables of any length compiles twice at most (``rows`` likewise). Flat rather
than ``[n, 4]``, because Dynamo specialises sizes 0 and 1: a one-segment table would be a
case of its own. On the host because the op reads it there (a device table would cost a
sync). The wrappers ``gather_segments_op`` / ``merge_segments_op`` also take a sequence
of 4-tuples, converted to that tensor: in compiled code pass the tensor, built outside.

Both ops run the checked public functions, so bad tables raise the same typed errors,
and either backend (Triton, or the torch reference on CPU) sits behind them. Both stage
their table on every call, which a CUDA graph cannot replay: they carry
``torch.Tag.cudagraph_unsafe``, so torch.compile's CUDA graphs split around them (capture
``run_segments`` of a plan for a captured copy).

Equivalent PyTorch::

    out = torch.zeros(rows, H, dtype=dtype)
    for s, r, n, d in segments.view(-1, 4).tolist():
        out[d : d + n] = sources[s][r : r + n].to(dtype)
"""

from __future__ import annotations

import torch

from ...errors import SegmentError
from .contract import SEGMENT_FIELDS
from .launch import gather_segments, merge_segments

_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


def _check_table(segments) -> None:
    """What the fake implementations can check without data: the table's layout."""
    if (
        segments.dim() != 1
        or segments.dtype != torch.int64
        or segments.device.type != "cpu"
        or segments.shape[0] % SEGMENT_FIELDS
    ):
        raise SegmentError(
            f"the custom ops take segments as a flat int64 CPU tensor of {SEGMENT_FIELDS} words per"
            f" segment, got {segments.dtype} of shape {tuple(segments.shape)} on {segments.device}"
        )


def _rows(segments) -> list[list[int]]:
    _check_table(segments)
    return segments.view(-1, SEGMENT_FIELDS).tolist()


def _dtype(sources, dtype):
    return dtype or (sources[0].dtype if sources else torch.float32)


@torch.library.custom_op("mm_schedule::gather_segments", mutates_args=(), tags=_TAGS)
def _gather(
    sources: list[torch.Tensor], segments: torch.Tensor, rows: int, dtype: torch.dtype | None
) -> torch.Tensor:
    hidden = sources[0].shape[-1] if sources else 0
    out = torch.zeros(
        (rows, hidden), dtype=_dtype(sources, dtype), device=sources[0].device if sources else None
    )
    return gather_segments(sources, _rows(segments), out=out)


@_gather.register_fake
def _gather_fake(sources, segments, rows, dtype):
    _check_table(segments)
    if not sources:
        return torch.empty((rows, 0), dtype=_dtype(sources, dtype))
    return sources[0].new_empty((rows, sources[0].shape[-1]), dtype=_dtype(sources, dtype))


@torch.library.custom_op("mm_schedule::merge_segments_", mutates_args=("input_embeds",), tags=_TAGS)
def _merge(sources: list[torch.Tensor], segments: torch.Tensor, input_embeds: torch.Tensor) -> None:
    merge_segments(sources, _rows(segments), input_embeds)


@_merge.register_fake
def _merge_fake(sources, segments, input_embeds):
    _check_table(segments)


def segment_table(segments) -> torch.Tensor:
    """``segments`` as the ops take them: a flat int64 CPU tensor (a tensor is kept as it is
    when already one, else reshaped to one row)."""
    if isinstance(segments, torch.Tensor):
        return segments.reshape(-1)
    flat = [field for segment in segments for field in segment]
    return torch.tensor(flat, dtype=torch.int64)


def gather_segments_op(sources, segments, rows: int, dtype=None):
    """``torch.ops.mm_schedule.gather_segments`` with a table given as ``segment_table`` takes."""
    return torch.ops.mm_schedule.gather_segments(list(sources), segment_table(segments), rows, dtype)


def merge_segments_op(sources, segments, input_embeds):
    """``torch.ops.mm_schedule.merge_segments_`` with a table given as ``segment_table``
    takes; returns ``input_embeds``."""
    torch.ops.mm_schedule.merge_segments_(list(sources), segment_table(segments), input_embeds)
    return input_embeds
