"""Writing a step's rows: the plan's segment table through the trusted kernel path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .kernels.trusted import copy_segments
from .plan import HIT, StepPlan


class SegmentTable:
    """A plan's segments as ``(source, src_row, n_rows, dst_row)`` rows, read straight
    from its columns (no tuple is kept per segment)."""

    __slots__ = ("_columns",)

    def __init__(self, source, src_row, n_rows, dst_row) -> None:
        self._columns = (source, src_row, n_rows, dst_row)

    def __len__(self) -> int:
        return len(self._columns[0])

    def __iter__(self):
        return zip(*self._columns)

    def __getitem__(self, i: int) -> tuple[int, int, int, int]:
        s, r, n, d = self._columns
        return s[i], r[i], n[i], d[i]


def packed_table(plan: StepPlan) -> SegmentTable:
    return SegmentTable(plan.seg_source, plan.seg_src_row, plan.seg_rows, plan.seg_packed_row)


def fused_table(plan: StepPlan) -> SegmentTable:
    return SegmentTable(plan.seg_source, plan.seg_src_row, plan.seg_rows, plan.seg_token_row)


def one_dtype(tensors: Sequence[Any], target: Any) -> list[Any]:
    """The Triton kernel reads one source dtype per launch; sources that disagree (a bf16
    image encoder beside an fp32 audio one) are cast to ``target`` up front."""
    return [t if t is None or t.dtype == target else t.to(target) for t in tensors]


def copy_rows(plan: StepPlan, tensors: list[Any], table: SegmentTable, dst: Any, cache: Any) -> Any:
    """Run the table into ``dst``. If that fails, the step's cached entries are evicted
    before the error propagates: a bad entry is never served again."""
    try:
        return copy_segments(tensors, table, dst)
    except Exception:
        if cache is not None:
            for key, kind in zip(plan.keys, plan.kinds):
                if kind is HIT:
                    cache.discard(key)
        raise
