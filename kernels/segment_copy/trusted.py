"""The scheduler's own way into the segment copy: tables it built and checked itself.

The public launchers (``gather_segments``, ``merge_segments``) check every table and
tensor, which costs more host time per step than the copy itself on a CPU. The
scheduler's planner has already proved everything those checks look for, so it calls
``copy_segments`` here instead, which trusts its arguments completely. Nothing outside
the scheduler should call it: a wrong table here writes wrong rows or crashes.

Which implementation runs is decided once per process from ``MM_SCHEDULE_KERNEL_BACKEND``
and ``TRITON_INTERPRET`` (``kernels/backend.py``: read at the first call, not on every step); call
``forget_backend_choice`` after changing either at runtime.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Sequence
from itertools import accumulate
from operator import add, le, sub

import torch

from ...errors import GraphCaptureError
from ..backend import refresh_backend, uses_triton
from .host_copy import can_copy_bytes, copy_row_ranges


def forget_backend_choice() -> None:
    """Make the next ``copy_segments`` read the backend environment variables again."""
    refresh_backend()


def copy_segments(sources: list, segments: Sequence[tuple[int, int, int, int]], dst, *, static_sources=False):
    """Copy ``sources[s][r : r + n]`` to ``dst[d : d + n]`` for every ``(s, r, n, d)`` and return ``dst``.

    Trusted: ``sources`` are 2-D, row-contiguous, with ``dst``'s hidden size and on its
    device; every segment lies inside its source and ``dst``; no two segments write
    the same row. Rows are cast to ``dst``'s dtype. Nothing is checked.

    CUDA-graph capture: a captured copy keeps the sources' addresses and reads them again
    on every replay, so under capture it raises ``GraphCaptureError`` unless
    ``static_sources`` promises that the sources stay alive, at their addresses, for as
    long as the graph can be replayed. Even then the Triton path captures only one
    segment (a longer table is staged per call) and the torch path no table of
    ``SCATTER_MIN_SEGMENTS`` or more (its scatter uploads columns from pageable memory);
    capture ``run_segments`` of a plan for those.

    A table may say it is one of the simplest ones: with a true attribute
    ``whole_sources``, segment ``i`` is all of ``sources[i]`` (the torch path slices
    nothing); with an attribute ``whole_sources_rows`` (an int), besides, the segments
    fill ``dst`` rows ``[0, whole_sources_rows)`` in order, and the torch path copies
    without reading the table.

    Equivalent PyTorch::

        for s, r, n, d in segments:
            dst[d : d + n] = sources[s][r : r + n].to(dst.dtype)
    """
    if not segments:
        return dst
    if uses_triton(dst.device):
        _triton_launcher()(sources, segments, dst, static_sources=static_sources)
        return dst
    if not dst.is_cpu and not static_sources:
        _refuse_capture(dst.device, "copy_segments without static_sources=True")
    return _copy_with_torch(sources, segments, dst)


def _refuse_capture(device, what: str) -> None:
    from ..streams import layer

    if layer(device).capturing(device):
        raise GraphCaptureError(
            f"{what} was called while a CUDA graph is being captured: the graph would keep this"
            " call's source addresses (and host buffers) and read them again on every replay; pass"
            " static_sources=True for sources that stay at fixed addresses for as long as the graph,"
            " or capture run_segments of a plan"
        )


@functools.cache
def _triton_launcher():
    # Loaded on first use: the torch path must not import triton.
    from .launch import launch_trusted

    return launch_trusted


def _copy_with_torch(sources: list, segments: Sequence[tuple[int, int, int, int]], dst):
    """The whole table in as few calls as the layout allows: one ``cat`` into ``dst``
    when the segments fill consecutive rows in table order (the packed layout); else
    (the fused layout, rows between placeholders left alone) byte copies on the CPU
    (``host_copy``) or one ``_foreach_copy_`` into views of ``dst``. Whole sources are
    passed as they are; only partial ones are sliced. The table is read a column at a
    time (``segments.columns`` when it has them), so besides the slicing every pass over
    it runs inside C builtins."""
    whole_rows = getattr(segments, "whole_sources_rows", None)
    if whole_rows is not None:
        torch.cat(sources, out=dst if whole_rows == dst.shape[0] else dst[:whole_rows])
        return dst
    columns = getattr(segments, "columns", None)
    source_of, first_row, counts, rows = columns if columns is not None else [list(c) for c in zip(*segments)]
    ends = list(map(add, rows, counts))
    consecutive = rows[1:] == ends[:-1]
    if not consecutive and can_copy_bytes(sources, dst):
        copy_row_ranges(sources, source_of, first_row, counts, rows, dst,
                        whole_sources=getattr(segments, "whole_sources", False))
        return dst
    if getattr(segments, "whole_sources", False):
        views = sources
    else:
        views = [src if r == 0 and n == src.shape[0] else src[r : r + n]
                 for src, r, n in zip(map(sources.__getitem__, source_of), first_row, counts)]
    if consecutive:
        first, last = rows[0], ends[-1]
        torch.cat(views, out=dst if first == 0 and last == dst.shape[0] else dst[first:last])
        return dst
    if not dst.is_cpu and len(rows) >= SCATTER_MIN_SEGMENTS:
        return scatter_rows(views, counts, rows, dst)
    if not all(map(le, ends[:-1], rows[1:])):
        order = sorted(range(len(rows)), key=rows.__getitem__)
        views, rows, counts = ([column[i] for i in order] for column in (views, rows, counts))
        ends = list(map(add, rows, counts))
    # Views of dst cut at every segment boundary (the odd ones are the segments), a group
    # at a time: a few hundred live views never set off a garbage collection.
    for start in range(0, len(rows), _VIEWS_PER_GROUP):
        stop = min(start + _VIEWS_PER_GROUP, len(rows))
        sizes = [0] * (2 * (stop - start))
        sizes[1::2] = counts[start:stop]
        sizes[2::2] = map(sub, rows[start + 1 : stop], ends[start : stop - 1])  # the gaps between segments
        torch._foreach_copy_(list(dst[rows[start] : ends[stop - 1]].split(sizes)[1::2]), views[start:stop])
    return dst


_VIEWS_PER_GROUP = 256
# Off the CPU, a view and a copy per segment cost the host about 1.5 µs each, one packed
# scatter a fixed handful of calls; measured on the meta device (host work alone), the two
# cost the same at about this many segments.
SCATTER_MIN_SEGMENTS = 128


def scatter_rows(views: Sequence, counts: Sequence[int], rows: Sequence[int], dst):
    """Write ``views[i]`` (``counts[i]`` rows each) to ``dst[rows[i] : rows[i] + counts[i]]``
    in a fixed number of device calls, whatever the number of segments: the views are
    packed into one tensor, which ``index_copy_`` places by a row index built on the
    device from two small columns. The host copies those columns without waiting for the
    device; the packed copy and the index are transient (the packed rows are as large as
    an unfused step's result). Rows are cast to ``dst``'s dtype.

    Not capturable (``GraphCaptureError``): the columns are copied from pageable host
    memory, which a replayed graph would read again after it has been freed."""
    _refuse_capture(dst.device, "scatter_rows")
    packed = torch.cat(list(views))
    if packed.dtype != dst.dtype:
        packed = packed.to(dst.dtype)
    total = packed.shape[0]
    # Each segment's shift from its packed row to its destination row, then its length.
    columns = array("q", map(sub, rows, accumulate(counts, initial=0)))
    columns.extend(counts)
    host = torch.frombuffer(columns, dtype=torch.int64)
    shifts, lengths = host.to(dst.device, non_blocking=True).split(len(counts))
    index = torch.repeat_interleave(shifts, lengths, output_size=total)
    index += torch.arange(total, device=dst.device)
    dst.index_copy_(0, index, packed)
    return dst
