"""Writing a step's rows: the plan's segment table through the trusted kernel path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .kernels.segment_copy.host_copy import append_whole_sources
from .kernels.segment_copy.trusted import copy_segments
from .plan import StepPlan
from .plan.columns import counting


class SegmentTable:
    """A plan's segments as ``(source, src_row, n_rows, dst_row)`` rows, read straight
    from its columns (no tuple is kept per segment). ``whole_sources`` is set when segment
    ``i`` is source ``i``, whole; ``whole_sources_rows`` when, besides, the segments fill
    the destination in order from row 0 (see ``copy_segments``)."""

    __slots__ = ("_columns", "whole_sources", "whole_sources_rows")

    def __init__(self, source, src_row, n_rows, dst_row, whole_sources_rows: int | None = None,
                 whole_sources: bool = False) -> None:
        self._columns = (source, src_row, n_rows, dst_row)
        self.whole_sources = whole_sources or whole_sources_rows is not None
        self.whole_sources_rows = whole_sources_rows

    @property
    def columns(self) -> tuple:
        """``(source, src_row, n_rows, dst_row)`` as four sequences."""
        return self._columns

    def __len__(self) -> int:
        return len(self._columns[0])

    def __iter__(self):
        return zip(*self._columns)

    def __getitem__(self, i: int) -> tuple[int, int, int, int]:
        s, r, n, d = self._columns
        return s[i], r[i], n[i], d[i]


def _whole_sources(plan: StepPlan) -> bool:
    # One segment per source, as many rows as the sources hold and sources in segment
    # order: then every segment is a whole source (the usual all-cached step). All three
    # tests run in C, far cheaper than reading the table row by row.
    n = len(plan.rows)
    seg_source = plan.seg_source
    return len(seg_source) == n and plan.n_rows == sum(plan.rows) and (
        seg_source if type(seg_source) is list else list(seg_source)) == counting(n)


def packed_table(plan: StepPlan) -> SegmentTable:
    return SegmentTable(plan.seg_source, plan.seg_src_row, plan.seg_rows, plan.seg_packed_row,
                        plan.n_rows if _whole_sources(plan) else None)


def fused_table(plan: StepPlan) -> SegmentTable:
    return SegmentTable(plan.seg_source, plan.seg_src_row, plan.seg_rows, plan.seg_token_row,
                        whole_sources=_whole_sources(plan))


def one_dtype(tensors: Sequence[Any], target: Any) -> list[Any]:
    """The Triton kernel reads one source dtype per launch; sources that disagree (a bf16
    image encoder beside an fp32 audio one) are cast to ``target`` up front."""
    return [t if t is None or t.dtype == target else t.to(target) for t in tensors]


def copy_rows(tensors: Sequence[Any], table: SegmentTable, dst: Any) -> Any:
    """Run the table into ``dst`` (a failure propagates; the step then evicts its hits)."""
    return copy_segments(tensors, table, dst)


def copy_whole_sources(addresses: list, rows: list, out: Any, dtype: Any) -> Any:
    """The packed rows of whole sources in order, of ``dtype``, given by the addresses of
    their first rows (a step of cache hits: ``StepPlan.addresses``), into ``out``: one kernel
    launch; on ``meta`` its host work alone. Only where the Triton kernel runs
    (``launches_kernels``)."""
    _whole_sources_launcher()(addresses if type(addresses) is list else list(addresses),
                              rows if type(rows) is list else list(rows), out, dtype)
    return out


def _whole_sources_launcher():
    # Loaded on first use (it imports Triton); looked up on every call, so a replaced
    # launcher (a test serialising launches) is the one called.
    from .kernels.segment_copy import launch

    return launch.launch_whole_sources


def concat_rows(plan: StepPlan, tensors: Sequence[Any], out: Any = None) -> Any:
    """The packed rows of a table that is every source whole and in order (see
    ``packed_table``): their concatenation, written into ``out``; ``out`` None: a new
    tensor. A large CPU ``out`` is written with streaming stores (``append_whole_sources``)."""
    if out is None or out.is_meta:
        return torch.cat(tensors) if out is None else torch.cat(list(tensors), out=out)
    rows = plan.rows if type(plan.rows) is list else list(plan.rows)
    sources = tensors if type(tensors) is list else list(tensors)
    return out if append_whole_sources(sources, rows, out) else torch.cat(sources, out=out)

