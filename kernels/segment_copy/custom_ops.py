"""The segment gather and merge as ``torch.library`` custom ops, for ``torch.compile``.

A compiled model cannot trace into a Triton launcher that reads tensor addresses on the
host; it can call an opaque custom op whose output shape it learns from a fake (meta)
implementation. Registered here, on first import of this module:

- ``torch.ops.mm_schedule.gather_segments(sources, segments, rows, dtype)`` returns a new
  ``[rows, H]`` tensor (``dtype`` None: the sources' dtype); rows no segment names are
  zero, so the result never depends on uninitialised memory;
- ``torch.ops.mm_schedule.merge_segments_(sources, segments, input_embeds)`` writes into
  ``input_embeds`` in place (declared through ``mutates_args``) and returns nothing.

``segments`` is the flat list ``[source, src_row, n_rows, dst_row, ...]``; the wrappers
``gather_segments_op`` / ``merge_segments_op`` take the usual sequence of 4-tuples. Both
ops run the checked public functions, so bad tables raise the same typed errors, and
either backend (Triton, or the torch reference on CPU) sits behind them.

Equivalent PyTorch::

    out = torch.zeros(rows, H, dtype=dtype)
    for s, r, n, d in segments:
        out[d : d + n] = sources[s][r : r + n].to(dtype)
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch

from .contract import SEGMENT_FIELDS
from .launch import gather_segments, merge_segments


def _table(flat: Sequence[int]) -> list[tuple[int, ...]]:
    return [tuple(flat[i : i + SEGMENT_FIELDS]) for i in range(0, len(flat), SEGMENT_FIELDS)]


@torch.library.custom_op("mm_schedule::gather_segments", mutates_args=())
def _gather(
    sources: list[torch.Tensor], segments: list[int], rows: int, dtype: torch.dtype | None
) -> torch.Tensor:
    hidden = sources[0].shape[-1] if sources else 0
    out = torch.zeros(
        (rows, hidden),
        dtype=dtype or (sources[0].dtype if sources else torch.float32),
        device=sources[0].device if sources else None,
    )
    return gather_segments(sources, _table(segments), out=out)


@_gather.register_fake
def _gather_fake(sources, segments, rows, dtype):
    hidden = sources[0].shape[-1] if sources else 0
    return sources[0].new_empty((rows, hidden), dtype=dtype or sources[0].dtype)


@torch.library.custom_op("mm_schedule::merge_segments_", mutates_args=("input_embeds",))
def _merge(sources: list[torch.Tensor], segments: list[int], input_embeds: torch.Tensor) -> None:
    merge_segments(sources, _table(segments), input_embeds)


@_merge.register_fake
def _merge_fake(sources, segments, input_embeds):
    return None


def gather_segments_op(sources, segments, rows: int, dtype=None):
    """``torch.ops.mm_schedule.gather_segments`` with a sequence of 4-tuples."""
    return torch.ops.mm_schedule.gather_segments(
        list(sources), list(chain.from_iterable(segments)), rows, dtype
    )


def merge_segments_op(sources, segments, input_embeds):
    """``torch.ops.mm_schedule.merge_segments_`` with a sequence of 4-tuples; returns ``input_embeds``."""
    torch.ops.mm_schedule.merge_segments_(
        list(sources), list(chain.from_iterable(segments)), input_embeds
    )
    return input_embeds
