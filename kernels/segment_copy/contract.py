"""The segment table: the host-side contract between the scheduler and the kernels.

A segment ``(source, src_row, n_rows, dst_row)`` says: copy rows
``sources[source][src_row : src_row + n_rows]`` to rows ``dst_row : dst_row + n_rows``
of the destination. Tables are plain Python data built by the planner; everything
about them is checked here, on the host, before a kernel sees a pointer.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, NamedTuple

from ...errors import KernelInputError, SegmentError

SEGMENT_FIELDS = 4  # (source, src_row, n_rows, dst_row)
# Rows and row offsets are 32-bit integers where a launch passes them as arguments.
INT32_MAX = 2**31 - 1


class Segment(NamedTuple):
    source: int
    src_row: int
    n_rows: int
    dst_row: int


def total_rows(segments: Sequence[Segment]) -> int:
    return sum(s[2] for s in segments)


_FIELD_NAMES = Segment._fields


def _row_int(value, i: int, seg, field: str) -> int:
    """``value`` as a plain int: anything with ``__index__`` (numpy and 0-d torch integers
    too), but never a bool or a float, which ``int()`` would quietly truncate."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) == "torch.bool":
        raise SegmentError(f"segment {i} {tuple(seg)}: {field} is a bool ({value!r}); it must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise SegmentError(
            f"segment {i} {tuple(seg)}: {field} must be an integer, got {type(value).__name__} {value!r}"
        ) from None


def _as_segment(i: int, seg) -> Segment:
    try:
        fields = tuple(seg)
    except TypeError:
        fields = ()
    if len(fields) != SEGMENT_FIELDS:
        raise SegmentError(f"segment {i} must be (source, src_row, n_rows, dst_row), got {seg!r}")
    if all(type(f) is int for f in fields):
        return Segment(*fields)
    return Segment(*(_row_int(f, i, fields, name) for f, name in zip(fields, _FIELD_NAMES)))


def check_segments(segments: Sequence[Segment], source_rows: Sequence[int], dst_rows: int) -> list[Segment]:
    """Raise ``SegmentError`` unless every segment lies inside its source and the
    destination, and no two segments write the same destination row; return the table
    as ``Segment`` tuples of plain ints (what the launchers and the table packer take)."""
    n_sources = len(source_rows)
    spans = []
    checked = []
    for i, seg in enumerate(segments):
        seg = _as_segment(i, seg)
        source, src_row, n_rows, dst_row = seg
        if not 0 <= source < n_sources:
            raise SegmentError(
                f"segment {i} {tuple(seg)}: source index {source} out of range for {n_sources} sources"
            )
        if n_rows <= 0:
            raise SegmentError(f"segment {i} {tuple(seg)}: n_rows must be positive, got {n_rows}")
        if src_row < 0 or src_row + n_rows > source_rows[source]:
            raise SegmentError(
                f"segment {i} {tuple(seg)}: rows [{src_row}, {src_row + n_rows}) outside source {source}"
                f" which has {source_rows[source]} rows"
            )
        if dst_row < 0 or dst_row + n_rows > dst_rows:
            raise SegmentError(
                f"segment {i} {tuple(seg)}: destination rows [{dst_row}, {dst_row + n_rows}) outside"
                f" a destination of {dst_rows} rows"
            )
        if max(src_row + n_rows, dst_row + n_rows) > INT32_MAX:
            raise SegmentError(
                f"segment {i} {tuple(seg)}: row {max(src_row, dst_row) + n_rows} is past the kernels'"
                f" 32-bit row limit ({INT32_MAX}); split the tensor"
            )
        spans.append((dst_row, dst_row + n_rows, i))
        checked.append(seg)
    overlap = first_overlap(spans)
    if overlap is not None:
        raise SegmentError(f"segments {overlap[0]} and {overlap[1]} write overlapping destination rows")
    return checked


def first_overlap(ranges: list[tuple[int, int, Any]]) -> tuple[Any, Any] | None:
    """The labels of two ``(start, end, label)`` half-open ranges that share a row, or
    None when none do (``ranges`` is sorted in place)."""
    ranges.sort()
    for (_, end_a, a), (start_b, _, b) in pairwise(ranges):
        if start_b < end_a:
            return a, b
    return None


def check_tensors(sources: Sequence, dest) -> None:
    """Reject device, rank, hidden-size and layout problems with a message saying what to do."""
    if dest.dim() != 2:
        raise KernelInputError(
            f"destination must be 2-D [rows, hidden], got shape {tuple(dest.shape)}"
        )
    hidden = dest.shape[-1]
    if not dest.is_contiguous():
        raise KernelInputError(
            "destination must be contiguous; pass out=tensor.contiguous() and copy back"
        )
    for i, src in enumerate(sources):
        if src.dim() != 2:
            raise KernelInputError(
                f"source {i} must be 2-D [rows, hidden], got shape {tuple(src.shape)}; reshape(-1, hidden) it first"
            )
        if src.shape[1] != hidden:
            raise KernelInputError(
                f"source {i} has hidden size {src.shape[1]}, destination has {hidden}"
            )
        if src.device != dest.device:
            raise KernelInputError(
                f"source {i} is on {src.device}, destination on {dest.device}; move it with .to(device) first"
            )
        if not src.is_contiguous():
            raise KernelInputError(f"source {i} is not contiguous; call .contiguous() on it first")
        if src.dtype != dest.dtype and not (src.is_floating_point() and dest.is_floating_point()):
            raise KernelInputError(f"source {i} has dtype {src.dtype}, destination {dest.dtype}")
        if src.dtype != sources[0].dtype:
            raise KernelInputError(
                f"source {i} has dtype {src.dtype}, source 0 has {sources[0].dtype}; one table takes one"
                " source dtype (cast the odd source, or split the table by dtype)"
            )
